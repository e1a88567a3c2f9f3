"""The `python` tool's sandbox, attacked as a hostile model would: what the child can reach."""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path

import pytest
from sandbox_probe import sandboxed

import flowlearn
import flowlearn.evals
from flowlearn.nodes.tools.python_sandbox import run_python


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


@sandboxed
def test_allowed_packages_import_and_the_project_does_not() -> None:
    pytest.importorskip("numpy")
    assert run_python("import numpy\nint(numpy.arange(5).sum())") == "10"
    assert "ModuleNotFoundError: No module named 'flowlearn'" in run_python("import flowlearn")
