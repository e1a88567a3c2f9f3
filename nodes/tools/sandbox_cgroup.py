"""Per-run cgroups for the sandbox: an exact cap on its processes, and on all its memory.

Processes: the kernel exempts the host's root from `RLIMIT_NPROC` (its user namespace maps to
root), so on a root host the sandbox's cap on processes and threads was only the 20 ms count of
`sandbox_process`, which a tight `threading.Thread` loop outruns by a few hundred threads
(CI saw 253 against a cap of 16). Where this process may create a cgroup with a pids
controller (root in most containers, or a delegated cgroup), each run gets its own, with
`pids.max` set; the kernel then refuses the fork or thread over the cap (`EAGAIN`, as
`RLIMIT_NPROC` does), and the count stays as the last line.

Memory: resident memory summed over address spaces misses the pages a process can pin outside
them: memfds, detached SysV segments, tmpfs files (a red team held 6 GB so under a 1 GB limit).
A memory cgroup charges those pages too, so where one can be made each run gets its own, its
limit the run's (`memory.max` and `memory.swap.max` 0 on v2; `memory.limit_in_bytes` and
`memory.memsw.limit_in_bytes` on v1), and the kernel OOM-kills inside it. Where none can be
made, a warning says once that the limit counts resident memory only.

The child enters its cgroups before it becomes bwrap (`sh` writes its own PID, then `exec`s), so
every process of the run is born inside them: nothing can fork or allocate before the caps hold.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PREFIX = "flowlearn-"
"""Name of each run's cgroup: the prefix, this process's PID, a random part."""
log = logging.getLogger(__name__)


def _candidates(controller: str) -> list[Path]:
    """Return this process's cgroup folders for `controller`: cgroup v1's hierarchy, then v2's."""
    mounts: dict[str, Path] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fstype, _, options = [*right.split(), "", "", ""][:3]
            point = Path(left.split()[4])
            if fstype == "cgroup" and controller in options.split(","):
                mounts.setdefault(controller, point)
            elif fstype == "cgroup2":
                mounts.setdefault("", point)
    found: dict[str, Path] = {}
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            key = controller if controller in controllers.split(",") else controllers
            if key in mounts:
                found[key] = mounts[key] / path.lstrip("/")
    return [found[key] for key in (controller, "") if key in found]


def _limit(folder: Path, controller: str, value: int) -> None:
    """Set `controller`'s limit in `folder` (the v2 file where it exists, else v1's)."""
    if controller == "pids":
        (folder / "pids.max").write_text(f"{value}\n")
        return
    if (folder / "memory.max").exists():
        (folder / "memory.max").write_text(f"{value}\n")
        with contextlib.suppress(FileNotFoundError):  # absent without swap accounting
            (folder / "memory.swap.max").write_text("0\n")
        return
    # v1: the memory limit first; memory+swap may never be set below it.
    (folder / "memory.limit_in_bytes").write_text(f"{value}\n")
    with contextlib.suppress(FileNotFoundError):  # absent without swap accounting
        (folder / "memory.memsw.limit_in_bytes").write_text(f"{value}\n")


def _try(base: Path, controller: str) -> bool:
    probe = base / f"{PREFIX}probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        _limit(probe, controller, 4 if controller == "pids" else 2**30)
        return (probe / "cgroup.procs").exists()
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


def _sweep(base: Path) -> None:
    """Remove empty cgroups that runs of ended processes left behind."""
    for stale in base.glob(f"{PREFIX}*"):
        owner = stale.name[len(PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            with contextlib.suppress(OSError):
                stale.rmdir()


def _base(controller: str) -> Path | None:
    for base in _candidates(controller):
        if _try(base, controller):
            _sweep(base)
            return base
    return None


@functools.cache
def pids_base() -> Path | None:
    """Return the folder under which runs' pids cgroups can be made here, or None."""
    return _base("pids")


@functools.cache
def memory_base() -> Path | None:
    """Return the folder under which runs' memory cgroups can be made here, or None."""
    return _base("memory")


@functools.cache
def warn_resident_only() -> None:
    """Log, once per process, that the sandbox's memory limit has a hole on this host."""
    log.warning(
        "no memory cgroup can be made on this host: the python sandbox's memory limit counts "
        "only resident memory, so memfds, SysV/POSIX shared memory and tmpfs files are not "
        "counted against it (run as root, or delegate a cgroup v2 subtree, to close this)"
    )


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _read_key(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


@dataclass(frozen=True)
class MemoryCgroup:
    """One run's memory cgroup: what it holds, and whether the kernel enforced its limit."""

    folder: Path
    limit: int
    """Bytes: the run's memory limit, which the kernel holds it to."""

    @property
    def _v2(self) -> bool:
        return (self.folder / "memory.max").exists()

    def usage(self) -> int:
        """Return the bytes charged now: resident, shmem, memfd and tmpfs pages alike."""
        name = "memory.current" if self._v2 else "memory.usage_in_bytes"
        return _read_int(self.folder / name)

    def peak(self) -> int:
        """Return the most bytes charged at once (the current charge where no peak is kept)."""
        name = "memory.peak" if self._v2 else "memory.max_usage_in_bytes"
        return _read_int(self.folder / name) or self.usage()

    def oom_kills(self) -> int:
        """Return how many of the run's processes the kernel killed for the limit."""
        if self._v2:
            return _read_key(self.folder / "memory.events", "oom_kill")
        return _read_key(self.folder / "memory.oom_control", "oom_kill")

    def hit_limit(self) -> bool:
        """Whether a charge ever met the limit (refused, reclaimed or answered by a kill)."""
        if self._v2:
            events = self.folder / "memory.events"
            return any(_read_key(events, key) for key in ("max", "oom", "oom_kill"))
        names = ("memory.failcnt", "memory.memsw.failcnt")
        return any(_read_int(self.folder / name) for name in names)


@dataclass(frozen=True)
class Cgroups:
    """What `capped` yields: the command to run, and the run's memory cgroup if it has one."""

    argv: list[str]
    memory: MemoryCgroup | None = None


def _remove(folder: Path, wait: float = 2.0) -> None:
    # The sandbox's last processes are reaped just after its init exits; wait for them.
    end = time.monotonic() + wait
    while True:
        try:
            folder.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if time.monotonic() >= end:
                log.warning("could not remove the sandbox's cgroup %s: %s", folder, exc)
                return
            time.sleep(0.01)


def _make(base: Path, made: dict[Path, Path]) -> Path:
    """Return this run's folder under `base`, made once (v2 keeps pids and memory in one)."""
    if base not in made:
        folder = base / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        folder.mkdir()
        made[base] = folder
    return made[base]


@contextlib.contextmanager
def capped(argv: list[str], max_tasks: int, memory_bytes: int | None = None) -> Iterator[Cgroups]:
    """Yield `argv` wrapped to run in fresh cgroups: tasks capped, and memory if it is given.

    A controller whose cgroup cannot be made here (`pids_base`, `memory_base` None, or the
    write refused) is left out, with a warning; with neither, `argv` comes back unchanged. The
    cgroups are removed when the block ends (the run must be over by then).
    """
    made: dict[Path, Path] = {}
    procs: list[Path] = []
    memory = None
    try:
        wanted = [("pids", pids_base(), max_tasks)]
        if memory_bytes is not None:
            wanted.append(("memory", memory_base(), memory_bytes))
        for controller, base, value in wanted:
            try:
                if base is None:
                    raise OSError("none can be made on this host")
                folder = _make(base, made)
                _limit(folder, controller, value)
            except OSError as exc:  # e.g. the hierarchy's cgroup.max.descendants
                if controller == "pids":  # the count still holds
                    log.warning(
                        "no pids cgroup for this run (%s); its processes are counted only", exc
                    )
                else:
                    warn_resident_only()
                continue
            if folder / "cgroup.procs" not in procs:
                procs.append(folder / "cgroup.procs")
            if controller == "memory":
                memory = MemoryCgroup(folder, value)
        enter = "".join(f"echo $$ > {shlex.quote(str(path))} && " for path in procs)
        wrapped = ["/bin/sh", "-c", enter + 'exec "$@"', "sh", *argv] if procs else argv
        yield Cgroups(wrapped, memory)
    finally:
        for folder in made.values():
            _remove(folder)
