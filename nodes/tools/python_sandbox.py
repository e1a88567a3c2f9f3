"""The `python` tool: run code in a separate, limited process and return what it printed."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from flowlearn.nodes.messages import to_langchain

# Only these variables reach the child; everything else (API keys, tokens, cloud credentials)
# stays behind. HOME and TMPDIR point into the run's own temporary folder.
_PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
# A fenced block: its tag (the first word after the fence, maybe empty) and its body.
_FENCED = re.compile(r"```[ \t]*([^\s`]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = frozenset({"python", "py", "python3"})


def scrubbed_env(workdir: str) -> dict[str, str]:
    """Return the child's environment: a short allow-list, nothing secret."""
    env = {k: os.environ[k] for k in _PASSED_ENV if k in os.environ}
    env.update(HOME=workdir, TMPDIR=workdir, PYTHONIOENCODING="utf-8", PYTHONDONTWRITEBYTECODE="1")
    return env


def _limits(memory_mb: int, cpu_seconds: int, file_mb: int) -> Callable[[], None]:
    def apply() -> None:  # runs in the child between fork and exec (Linux/macOS)
        import resource

        memory = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds))
        files = file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (files, files))

    return apply


def _read_capped(path: Path, limit: int) -> str:
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    text = data[:limit].decode("utf-8", errors="replace")
    if len(data) > limit:
        total = path.stat().st_size
        text += f"\n[... output truncated: {total - limit} more bytes]"
    return text


def run_python(
    code: str,
    *,
    timeout: float = 10.0,
    memory_mb: int = 1024,
    max_output_chars: int = 8000,
) -> str:
    """Run `code` in a fresh interpreter in a temporary folder and report its output.

    The child runs with `python -I` in a new session, a scrubbed environment, memory, CPU-time and
    file-size limits, and a wall-clock timeout after which its whole process group is killed.
    The folder is removed afterwards. Never raises for problems in the code itself.
    """
    with tempfile.TemporaryDirectory(prefix="flowlearn-py-") as workdir:
        folder = Path(workdir)
        (folder / "main.py").write_text(code, encoding="utf-8")
        out_path, err_path = folder / ".stdout", folder / ".stderr"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", "main.py"],
                cwd=workdir,
                env=scrubbed_env(workdir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                preexec_fn=_limits(memory_mb, int(timeout) + 1, 64)
                if sys.platform != "win32"
                else None,
            )
            try:
                code_rc = proc.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                code_rc = proc.wait()
                timed_out = True
        stdout = _read_capped(out_path, max_output_chars)
        stderr = _read_capped(err_path, max_output_chars)
    parts = []
    if stdout.strip():
        parts.append(stdout.rstrip())
    if timed_out:
        parts.append(f"Error: timed out after {timeout:g} s; the process was killed.")
    elif code_rc != 0:
        reason = f"exit code {code_rc}" if code_rc > 0 else f"killed by signal {-code_rc}"
        tail = stderr.strip() or "(no error output)"
        if "MemoryError" in tail:
            tail += f"\n(memory is limited to {memory_mb} MB)"
        parts.append(f"Error ({reason}):\n{tail}")
    return "\n".join(parts) if parts else "(no output; use print() to show results)"


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def extract_code(text: str) -> str:
    """Return the code block of a model's reply, or the whole reply when it has no fences.

    The last block tagged python/py wins; else the first untagged block that parses as Python,
    else the first untagged block. A block tagged otherwise (text, output, console) is never
    run: it is often the expected output written beside the code.
    """
    blocks = [(m.group(1).lower(), m.group(2).strip()) for m in _FENCED.finditer(text)]
    tagged = [body for tag, body in blocks if tag in _PYTHON_TAGS]
    if tagged:
        return tagged[-1]
    untagged = [body for tag, body in blocks if not tag]
    for body in untagged:
        if _parses(body):
            return body
    return untagged[0] if untagged else text.strip()


def python_tool(
    *, timeout: float = 10.0, memory_mb: int = 1024, max_output_chars: int = 8000
) -> BaseTool:
    """Return the `python` tool: runs a Python program and returns what it prints."""

    def python(code: str) -> str:
        return run_python(
            extract_code(code),
            timeout=timeout,
            memory_mb=memory_mb,
            max_output_chars=max_output_chars,
        )

    return StructuredTool.from_function(
        python,
        name="python",
        description=(
            "Run a complete Python 3 program in a sandbox and return what it prints. "
            "Use it for arithmetic, counting, and checking calculations."
        ),
        metadata={
            "usage_notes": "Print every result you need; variables do not persist between "
            f"calls; no network; {timeout:g} s limit."
        },
    )


def python_coder_tool(engine: Any, **limits: Any) -> BaseTool:
    """Return `python_coder`: the engine writes a program for the task, which then runs.

    As the paper's Python coder does; the generated code only ever runs in the sandbox.
    """

    def python_coder(task: str) -> str:
        prompt = (
            f"Write a short, complete Python 3 program that solves this task and prints the "
            f"result. Reply with only the code in a ```python block.\n\nTask: {task}"
        )
        reply = engine.invoke(to_langchain([{"role": "user", "content": prompt}])).text
        code = extract_code(reply)
        return f"Code:\n{code}\n\nOutput:\n{run_python(code, **limits)}"

    return StructuredTool.from_function(
        python_coder,
        name="python_coder",
        description="Describe a calculation in words; code is written for it and run.",
        metadata={"usage_notes": "State the numbers and what to compute precisely."},
    )
