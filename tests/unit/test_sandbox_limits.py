"""The `python` tool's sandbox, attacked as a hostile model would: the limits on a run hold."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid
from pathlib import Path

import pytest
from sandbox_probe import sandboxed

from flowlearn.nodes.tools import sandbox_cgroup
from flowlearn.nodes.tools.python_sandbox import NO_OUTPUT, python_tool, run_python
from flowlearn.nodes.tools.sandbox_cgroup import PREFIX, memory_base, pids_base


def host_processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


SPAWN = """import os, subprocess, sys, time
sleeper = [sys.executable, '-c', 'import time; time.sleep(60)', '{marker}']
if os.fork() == 0:  # a plain background child
    os.execv(sys.executable, sleeper)
if os.fork() == 0:  # setsid, then a double fork: the grandchild is an orphan in a new session
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, sleeper)
    os._exit(0)
subprocess.Popen(sleeper, start_new_session=True, stdout=subprocess.DEVNULL)
time.sleep({linger})
print('spawned')
"""


@sandboxed
def test_background_setsid_and_double_forked_children_end_with_the_run() -> None:
    marker = f"flowlearn-marker-{uuid.uuid4().hex}"
    result: list[str] = []
    run = threading.Thread(
        target=lambda: result.append(run_python(SPAWN.format(marker=marker, linger=1.5)))
    )
    run.start()
    seen: list[int] = []
    deadline = time.monotonic() + 5
    while len(seen) < 3 and time.monotonic() < deadline:
        seen = host_processes_with(marker)
        time.sleep(0.05)
    run.join()
    assert len(seen) == 3, "the scan should see the three sleepers while the run lasts"
    assert result == ["spawned"]
    assert host_processes_with(marker) == []


@pytest.mark.parametrize(
    "trick",
    [
        "import os\nos.mkfifo('.stdout')\nopen('.stdout', 'w').write('x')",
        "import os\nos.mkfifo('f')\nfd = os.open('f', os.O_RDWR)\nos.dup2(fd, 1)\n"
        "print('x' * 10**7, flush=True)",
        "import os, time\nos.close(1)\nos.close(2)\nwhile True:\n    time.sleep(0.01)",
        "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    signal = __import__('signal')\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    while True:\n        pass\n"
        "time.sleep(30)",
    ],
    ids=["fifo-named-stdout", "fifo-on-fd-1", "closed-output", "sigterm-spinner", "setsid-spin"],
)
@sandboxed
def test_timeout_holds_against_output_tricks(trick: str) -> None:
    start = time.monotonic()
    out = run_python(trick, timeout=1)
    assert time.monotonic() - start < 3
    assert out.endswith("Error: timed out after 1 s; the process was killed."), out


@sandboxed
def test_a_replaced_stdout_cannot_redirect_or_block_the_reader() -> None:
    code = "import os\nos.close(1)\nos.open('elsewhere', os.O_WRONLY | os.O_CREAT)\nprint('hidden')"
    start = time.monotonic()
    assert run_python(code, timeout=5) == NO_OUTPUT
    assert time.monotonic() - start < 2


def kernel_caps_processes() -> bool:
    """Whether the kernel refuses a run's task over the cap: RLIMIT_NPROC (non-root) or a cgroup."""
    return os.geteuid() != 0 or pids_base() is not None


@pytest.mark.parametrize(
    "bomb",
    [
        "import os, time\nn = 0\ntry:\n    while n < 500:\n        if os.fork() == 0:\n"
        "            time.sleep(30)\n            os._exit(0)\n        n += 1\n"
        "except OSError as exc:\n    print('fork refused at', n, exc.strerror)",
        "import threading, time\nn = 0\ntry:\n    while n < 500:\n"
        "        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "        n += 1\nexcept RuntimeError as exc:\n    print('thread refused at', n, exc)",
    ],
    ids=["fork-loop", "thread-loop"],
)
@sandboxed
def test_process_count_is_bounded(bomb: str) -> None:
    out = run_python(bomb, max_processes=16, memory_mb=4096, timeout=10)
    refused = re.search(r"refused at (\d+)", out)
    killed = re.search(r"ran (\d+) processes and threads, over the limit of 16", out)
    if kernel_caps_processes():
        # RLIMIT_NPROC (non-root hosts) or the run's pids cgroup: the kernel refuses the 17th.
        assert refused, out
        assert int(refused.group(1)) <= 16, out
    else:  # only the 20 ms count: the run goes over, and is killed within a tick or two
        assert refused or killed, out


@pytest.mark.skipif(pids_base() is None, reason="no pids cgroup can be made on this host")
def test_empty_cgroups_of_ended_processes_are_swept_at_the_probe() -> None:
    base = pids_base()
    assert base is not None
    dead = 2**22 + 1  # above pid_max's default ceiling: no process has it
    stale, alive = base / f"{PREFIX}{dead}-test", base / f"{PREFIX}{os.getpid()}-test"
    stale.mkdir()
    alive.mkdir()
    try:
        pids_base.cache_clear()
        assert pids_base() == base
        assert not stale.exists()
        assert alive.exists()  # this process still runs: its cgroups are its own to remove
    finally:
        for folder in (stale, alive):
            if folder.exists():
                folder.rmdir()


@sandboxed
def test_a_run_whose_cgroup_cannot_be_made_still_runs_under_the_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox_cgroup, "pids_base", lambda: tmp_path / "gone")
    assert run_python("print(6 * 7)") == "42"
    assert "no pids cgroup for this run" in caplog.text


@pytest.mark.skipif(pids_base() is None, reason="no pids cgroup can be made on this host")
@sandboxed
def test_each_run_gets_its_own_pids_cgroup_and_it_is_removed() -> None:
    base = pids_base()
    assert base is not None
    before = set(base.glob(f"{PREFIX}*"))
    code = "print(open('/proc/self/cgroup').read())"
    assert "flowlearn-" not in run_python(code)  # the cgroup namespace hides the host's path
    threads = "import threading, time\n" + (
        "[threading.Thread(target=time.sleep, args=(1,)).start() for _ in range(12)]\nprint('ok')"
    )
    assert run_python(threads, max_processes=16) == "ok"  # the cap leaves room for bwrap
    assert set(base.glob(f"{PREFIX}*")) == before


@sandboxed
def test_memory_of_the_whole_tree_is_bounded() -> None:
    code = (
        "import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n"
        "        block = b'x' * (150 * 2**20)\n        time.sleep(20)\n        os._exit(0)\n"
        "time.sleep(20)"
    )
    start = time.monotonic()
    out = run_python(code, memory_mb=400, timeout=15)
    held = re.search(r"held (\d+) MB together, (over|reaching) the 400 MB limit", out)
    assert held, out  # 8 x 150 MB were asked for: 1200 MB
    assert int(held.group(1)) < 600 and time.monotonic() - start < 10, out


@sandboxed
def test_disk_is_bounded_and_a_full_disk_fails_cleanly() -> None:
    code = "f = open('big', 'wb')\nfor i in range(100):\n    f.write(b'x' * 2**20)\n    f.flush()"
    out = run_python(code, disk_mb=16)
    assert out.startswith("Error (exit code 1):") and "No space left on device" in out, out
    assert (
        run_python(
            "import os\nos.statvfs('.').f_blocks * os.statvfs('.').f_frsize // 2**20", disk_mb=16
        )
        == "16"
    )


@sandboxed
def test_concurrent_runs_keep_their_own_output() -> None:
    results: dict[int, str] = {}
    threads = [
        threading.Thread(target=lambda n=n: results.__setitem__(n, run_python(f"print({n})\n{n}")))
        for n in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {n: f"{n}\n{n}" for n in range(8)}


# Pages no address space counts: 8 x 64 MB (512 MB) against a 256 MB limit.
MEMFD_ATTACK = """import os
fds = []
for i in range(8):
    fd = os.memfd_create(f'hold{i}')
    for _ in range(64):
        os.write(fd, b'x' * 2**20)
    fds.append(fd)
print('held', len(fds))
"""
SYSV_ATTACK = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
for i in range(8):
    segment = libc.shmget(0, 64 * 2**20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
    assert segment >= 0, ctypes.get_errno()
    address = libc.shmat(segment, None, 0)
    ctypes.memset(address, 1, 64 * 2**20)
    libc.shmdt(ctypes.c_void_p(address))  # detached: in no address space, still held
print('held', i + 1)
"""


def resident_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@sandboxed
@pytest.mark.parametrize("attack", [MEMFD_ATTACK, SYSV_ATTACK], ids=["memfd", "sysv"])
def test_memory_no_address_space_counts_is_held_to_the_limit(
    attack: str, caplog: pytest.LogCaptureFixture
) -> None:
    base = memory_base()
    if base is None:  # this host cannot count these pages: the user must be told so
        sandbox_cgroup.warn_resident_only.cache_clear()
        notes = python_tool(memory_mb=256).metadata["usage_notes"]  # type: ignore[index]
        assert "counts only resident memory" in caplog.text
        assert "256 MB of memory (resident only)" in notes
        pytest.skip("no memory cgroup can be made on this host; the warning is shown")
    before, rss = set(base.glob(f"{PREFIX}*")), resident_mb()
    start = time.monotonic()
    out = run_python(attack, memory_mb=256, timeout=10)
    assert out.startswith("Error: memory limit:") and "256 MB limit" in out, out
    assert "held 8" not in out and time.monotonic() - start < 10, out
    assert resident_mb() - rss < 64  # the pages were the sandbox's, never this process's
    assert set(base.glob(f"{PREFIX}*")) == before  # the run's cgroup is gone with it


@sandboxed
def test_without_a_memory_cgroup_the_resident_watch_holds_and_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(sandbox_cgroup, "memory_base", lambda: None)
    sandbox_cgroup.warn_resident_only.cache_clear()
    code = (  # 4 x 100 MB in 4 processes: each under RLIMIT_AS, together over the limit
        "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n"
        "        block = b'x' * (100 * 2**20)\n        time.sleep(20)\n"
        "time.sleep(20)"
    )
    out = run_python(code, memory_mb=256, timeout=5)
    assert re.search(r"memory limit: .* over the 256 MB limit", out), out
    assert "counts only resident memory" in caplog.text


@sandboxed
def test_open_files_are_bounded() -> None:
    code = (
        "import os\nfds = []\ntry:\n    for _ in range(10000):\n"
        "        fds.append(os.open('/dev/null', os.O_RDONLY))\n"
        "except OSError as exc:\n    print('refused', len(fds), exc.errno)"
    )
    refused = re.fullmatch(r"refused (\d+) 24", run_python(code))  # EMFILE
    assert refused and int(refused.group(1)) < 256, refused
