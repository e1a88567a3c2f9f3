"""Run the runner on a program, in the bubblewrap sandbox or (opted into) unisolated."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from flowlearn.nodes.tools.sandbox import PACKAGES, bwrap_argv, interpreter
from flowlearn.nodes.tools.sandbox_cgroup import capped
from flowlearn.nodes.tools.sandbox_process import Outcome, TreeLimits, run_child

RUNNER = Path(__file__).with_name("sandbox_runner.py")
"""The program the child runs: limits, then `main.py` as a notebook cell."""
# Unisolated only: these variables reach the child; API keys, tokens and credentials stay
# behind. (The sandbox's child gets a fixed environment of its own, nothing of ours.)
_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one run of model-written code may use; passing any limit ends the run."""

    timeout: float = 10.0
    """Wall-clock seconds; then every process of the run is killed."""
    memory_mb: int = 1024
    """All memory of the run's processes together: held by the kernel through a memory cgroup
    of the run's own where one can be made (memfds, shared memory and tmpfs pages included),
    else their resident memory sampled every 20 ms; and each process's address space.
    Unisolated: per process only."""
    max_processes: int = 32
    """Processes and threads alive at once, the sandbox's init included (sandbox only):
    `RLIMIT_NPROC` where the kernel applies it (not to the host's root, which it exempts), a
    pids cgroup where one can be made (`sandbox_cgroup`), and a count every 20 ms."""
    disk_mb: int = 64
    """Size of the writable folder (sandbox); unisolated: the largest file."""
    max_output_chars: int = 8000
    """Bytes kept of stdout and of stderr; the rest is counted in a truncation marker."""

    def __post_init__(self) -> None:
        """Refuse limits that would switch a bound off."""
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise ValueError(f"timeout must be a positive number of seconds, not {self.timeout}")
        for name in ("memory_mb", "max_processes", "disk_mb", "max_output_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")


def scrubbed_env(workdir: str) -> dict[str, str]:
    """Return the unisolated child's environment: a short allow-list, nothing secret."""
    env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
    env.update(HOME=workdir, TMPDIR=workdir)
    return env


@functools.cache
def runner_source() -> str:
    """Return the runner's source, which the child gets as `python -I -c`."""
    return RUNNER.read_text(encoding="utf-8")


def _runner_args(limits: Limits, *, processes: int, paths: tuple[str, ...]) -> list[str]:
    mb = 2**20
    cpu = int(limits.timeout) + 1
    sizes = [limits.memory_mb * mb, processes, limits.disk_mb * mb, cpu]
    return ["-I", "-c", runner_source(), *map(str, sizes), *paths]


@contextlib.contextmanager
def _code_fd(code: str) -> Iterator[int]:
    fd = os.memfd_create("flowlearn-main.py")
    try:
        os.write(fd, code.encode("utf-8", errors="surrogateescape"))
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)


def run_isolated(code: str, limits: Limits, bwrap: str) -> Outcome:
    """Run `code` in the sandbox that `bwrap` builds, watching the tree's memory."""
    info_r, info_w = os.pipe()
    try:
        with _code_fd(code) as code_fd:
            disk = limits.disk_mb * 2**20
            argv = bwrap_argv(bwrap, disk_bytes=disk, info_fd=info_w, code_fd=code_fd)
            argv += [
                interpreter(),
                *_runner_args(limits, processes=limits.max_processes, paths=(PACKAGES,)),
            ]
            # bwrap's own parent, outside the sandbox, is the one task more in the cgroup.
            memory = limits.memory_mb * 2**20
            with capped(argv, limits.max_processes + 1, memory) as cgroups:
                return run_child(
                    cgroups.argv,
                    timeout=limits.timeout,
                    max_output_bytes=limits.max_output_chars,
                    tree=TreeLimits(memory, limits.max_processes),
                    pass_fds=(info_w, code_fd),
                    info_fd=info_r,
                    memory=cgroups.memory,
                )
    finally:
        os.close(info_w)


def run_unisolated(code: str, limits: Limits) -> Outcome:
    """Run `code` in a plain child process in a temporary folder: limits and env scrub only."""
    with tempfile.TemporaryDirectory(prefix="flowlearn-py-") as workdir:
        Path(workdir, "main.py").write_text(code, encoding="utf-8")
        return run_child(
            [sys.executable, *_runner_args(limits, processes=0, paths=())],
            timeout=limits.timeout,
            max_output_bytes=limits.max_output_chars,
            tree=None,
            cwd=workdir,
            env=scrubbed_env(workdir),
        )
