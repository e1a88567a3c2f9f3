"""An exact cap on the sandbox's processes where `RLIMIT_NPROC` does not hold: a pids cgroup.

The kernel exempts the host's root from `RLIMIT_NPROC` (its user namespace maps to root), so on
a root host the sandbox's cap on processes and threads was only the 20 ms count of
`sandbox_process`, which a tight `threading.Thread` loop outruns by a few hundred threads
(CI saw 253 against a cap of 16). Where this process may create a cgroup with a pids
controller (root in most containers, or a delegated cgroup), each run gets its own, with
`pids.max` set; the kernel then refuses the fork or thread over the cap (`EAGAIN`, as
`RLIMIT_NPROC` does), and the count stays as the last line. Elsewhere nothing changes.

The child enters its cgroup before it becomes bwrap (`sh` writes its own PID, then `exec`s), so
every process of the run is born inside it: nothing can fork before the cap holds.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

PREFIX = "flowlearn-"
"""Name of each run's cgroup: the prefix, this process's PID, a random part."""
_ENTER = 'echo $$ > "$0" && exec "$@"'
log = logging.getLogger(__name__)


def _candidates() -> list[Path]:
    """Return this process's pids cgroup folders: cgroup v1's pids hierarchy, then v2's."""
    mounts: dict[str, Path] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            left, _, right = line.partition(" - ")
            fstype, _, options = [*right.split(), "", "", ""][:3]
            point = Path(left.split()[4])
            if fstype == "cgroup" and "pids" in options.split(","):
                mounts.setdefault("pids", point)
            elif fstype == "cgroup2":
                mounts.setdefault("", point)
    found: dict[str, Path] = {}
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            key = "pids" if "pids" in controllers.split(",") else controllers
            if key in mounts:
                found[key] = mounts[key] / path.lstrip("/")
    return [found[key] for key in ("pids", "") if key in found]


def _try(base: Path) -> bool:
    probe = base / f"{PREFIX}probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        (probe / "pids.max").write_text("4\n")
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


@functools.cache
def pids_base() -> Path | None:
    """Return the folder under which runs' pids cgroups can be made here, or None."""
    for base in _candidates():
        if _try(base):
            _sweep(base)
            return base
    return None


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


@contextlib.contextmanager
def capped(argv: list[str], max_tasks: int) -> Iterator[list[str]]:
    """Yield `argv` wrapped to run in a fresh pids cgroup capped at `max_tasks`.

    Where no pids cgroup can be made (`pids_base` is None), yield `argv` unchanged. The cgroup
    is removed when the block ends (the run must be over by then).
    """
    base = pids_base()
    if base is None:
        yield argv
        return
    folder = base / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
    try:
        folder.mkdir()
        (folder / "pids.max").write_text(f"{max_tasks}\n")
    except OSError as exc:  # e.g. the hierarchy's cgroup.max.descendants: the count still holds
        log.warning("no pids cgroup for this run (%s); its processes are counted only", exc)
        _remove(folder, wait=0)
        yield argv
        return
    try:
        yield ["/bin/sh", "-c", _ENTER, str(folder / "cgroup.procs"), *argv]
    finally:
        _remove(folder)
