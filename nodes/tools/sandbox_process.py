"""Start the `python` tool's child and watch it: output, wall clock, the tree's memory.

Output comes through pipes this process created, never through files in the child's folder, so
no FIFO, symlink or replaced descriptor inside can block the reader or send output elsewhere.
The pipes are read without blocking, capped, and only until the deadline. Every tick the
resident memory of all the sandbox's processes is summed (through its own procfs, at
`/proc/<pid 1>/root/proc`), and the whole sandbox is killed when it passes the limit. Where
the run has a memory cgroup (`sandbox_cgroup`), the kernel holds all its memory to the limit;
this side then ends the whole run at the first OOM kill the cgroup reports.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from flowlearn.nodes.tools.sandbox_cgroup import MemoryCgroup

TICK = 0.02
"""Seconds between checks of the clock and the memory; also the longest a sample can be late."""
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass
class Capped:
    """The first `limit` bytes of a stream, and how many bytes came in all."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        """Keep what fits; count the rest (the reader keeps draining, so writers never stall)."""
        room = self.limit - len(self.data)
        if room > 0:
            self.data += chunk[:room]
        self.total += len(chunk)

    def text(self) -> str:
        """Decode what was kept, with a marker when some was dropped."""
        text = self.data.decode("utf-8", errors="replace")
        if self.total > len(self.data):
            text += f"\n[... output truncated: {self.total - len(self.data)} more bytes]"
        return text


@dataclass
class Outcome:
    """How a child run ended, and what it wrote."""

    returncode: int
    stdout: Capped
    stderr: Capped
    timed_out: bool = False
    memory_mb: float | None = None
    """The tree's memory when it was killed for passing its limit (resident, or the memory
    cgroup's peak when the kernel enforced it); else None."""
    tasks: int | None = None
    """The tree's processes and threads when it was killed for having too many; else None."""

    @property
    def killed(self) -> bool:
        """Whether this side ended the run: the clock, the memory or the process count."""
        return self.timed_out or self.memory_mb is not None or self.tasks is not None


@dataclass(frozen=True)
class TreeLimits:
    """Bounds on all the sandbox's processes together, checked every `TICK`."""

    memory_bytes: int
    """Resident memory summed over the processes."""
    tasks: int
    """Processes and threads alive at once (what `RLIMIT_NPROC` counts, where it applies)."""


def tree_usage(pid: int) -> tuple[int, int]:
    """Return the resident bytes and the tasks of the PID namespace whose init is `pid`.

    (0, 0) until the sandbox's own procfs is in place: while bwrap sets up, `/proc/<pid>/root`
    is still the host's root, whose procfs must not be counted.
    """
    procfs = f"/proc/{pid}/root/proc"
    rss = tasks = 0
    try:
        if os.stat(f"{procfs}/1/ns/pid").st_ino != os.stat(f"/proc/{pid}/ns/pid").st_ino:
            return 0, 0
        names = [name for name in os.listdir(procfs) if name.isdigit()]
    except OSError:
        return 0, 0
    for name in names:
        try:
            with open(f"{procfs}/{name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
            tasks += int(fields[17])  # num_threads (field 20 of proc(5))
            rss += int(fields[21]) * _PAGE  # rss in pages (field 24)
        except (OSError, IndexError, ValueError):
            continue  # it ended between the listing and the read
    return rss, tasks


def _kill(proc: subprocess.Popen[bytes], init_pid: int | None) -> None:
    # The group catches bwrap itself (and, unisolated, the children that stayed in the group).
    for kill, pid in ((os.kill, init_pid), (os.killpg, proc.pid)):
        if pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


class _Watch:
    """The open pipes of one run and what came through them."""

    def __init__(self, out: int, err: int, info: int | None, limit: int) -> None:
        self.selector = selectors.DefaultSelector()
        self.streams = {out: Capped(limit), err: Capped(limit)}
        self.info = info
        self.info_data = bytearray()
        self.init: int | None = None
        for fd in (out, err, info):
            if fd is not None:
                os.set_blocking(fd, False)
                self.selector.register(fd, selectors.EVENT_READ)

    def read(self, timeout: float) -> bool:
        """Read what is ready within `timeout` seconds; close what ended. False: nothing was."""
        events = self.selector.select(timeout)
        for key, _ in events:
            fd = int(key.fd)
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                self.selector.unregister(fd)
                os.close(fd)
            elif fd == self.info:
                self.info_data += chunk
            else:
                self.streams[fd].add(chunk)
        return bool(events)

    def init_pid(self) -> int | None:
        """Return the host PID of the sandbox's PID 1, once bwrap has said it."""
        if self.init is None and b"}" in self.info_data:
            try:
                self.init = int(json.loads(self.info_data.split(b"}")[0] + b"}")["child-pid"])
            except (ValueError, KeyError, TypeError):
                return None
        return self.init

    def open(self) -> bool:
        """Whether an output pipe is still open."""
        return any(fd in self.selector.get_map() for fd in self.streams)

    def close(self) -> None:
        """Close every pipe still open."""
        for key in list(self.selector.get_map().values()):
            self.selector.unregister(key.fd)
            os.close(key.fd)
        self.selector.close()


def run_child(
    argv: Sequence[str],
    *,
    timeout: float,
    max_output_bytes: int,
    tree: TreeLimits | None,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    pass_fds: Sequence[int] = (),
    info_fd: int | None = None,
    memory: MemoryCgroup | None = None,
) -> Outcome:
    """Run `argv` and watch it until it ends, the deadline passes or the memory runs over.

    Args:
        argv: the command; stdin is /dev/null, stdout and stderr are this process's pipes.
        timeout: wall-clock seconds, after which the whole sandbox (or group) is killed.
        max_output_bytes: bytes kept of each of stdout and stderr.
        tree: bounds on the sandbox's processes together; None: not watched (unisolated).
        cwd: the child's working directory.
        env: the child's environment.
        pass_fds: descriptors the child inherits (the caller closes its own copies after).
        info_fd: the read end of bwrap's `--info-fd` pipe, which names the sandbox's PID 1.
        memory: the run's memory cgroup, whose usage and OOM kills are watched too; None: none.

    """
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    deadline = time.monotonic() + timeout
    watch = _Watch(out_r, err_r, info_fd, max_output_bytes)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out_w,
            stderr=err_w,
            pass_fds=tuple(pass_fds),
            start_new_session=True,
        )
    except BaseException:
        watch.close()
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    outcome = Outcome(-1, watch.streams[out_r], watch.streams[err_r])
    try:
        _follow(proc, watch, outcome, deadline, tree, memory)
    except BaseException:  # interrupted here: nothing of the child may outlive the call
        _kill(proc, watch.init_pid())
        proc.wait()
        raise
    finally:
        watch.close()
    return outcome


def _follow(
    proc: subprocess.Popen[bytes],
    watch: _Watch,
    outcome: Outcome,
    deadline: float,
    tree: TreeLimits | None,
    memory: MemoryCgroup | None,
) -> None:
    """Read until the child ends; kill it all at the deadline or when the tree runs over."""
    next_sample = time.monotonic()
    while proc.poll() is None:
        now = time.monotonic()
        if now >= deadline:
            outcome.timed_out = True
            break
        init = watch.init_pid()
        if tree is not None and init is not None and now >= next_sample:
            next_sample = now + TICK
            rss, tasks = tree_usage(init)
            # The cgroup's charge includes the resident pages, so the two are not added.
            held = max(rss, memory.usage()) if memory is not None else rss
            if held > tree.memory_bytes:
                outcome.memory_mb = held / 2**20
            elif memory is not None and memory.oom_kills():
                outcome.memory_mb = memory.peak() / 2**20
            if tasks > tree.tasks:
                outcome.tasks = tasks
            if outcome.killed:
                break
        wait = min(TICK, deadline - now)
        if watch.open():
            watch.read(wait)
        else:  # the child closed its output but may still run: wait on the process instead
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=wait)
    # Killing the sandbox's init ends all its processes; unisolated, the group is what goes.
    _kill(proc, watch.init_pid() if outcome.killed else None)
    outcome.returncode = proc.wait()
    # Killed by the kernel before a tick saw it, or a charge refused (`ENOMEM`) at the limit.
    if (
        memory is not None
        and not outcome.killed
        and (memory.oom_kills() or (outcome.returncode != 0 and memory.hit_limit()))
    ):
        outcome.memory_mb = memory.peak() / 2**20
    grace = time.monotonic() + 0.2  # what was written just before the end
    while watch.open() and time.monotonic() < grace and watch.read(0):
        pass
