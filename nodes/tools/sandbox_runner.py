"""The program the `python` tool's child runs: limits, then `main.py` as a notebook cell.

This file is not imported in the child: its source is handed to `python -I -c`, so it uses the
standard library only. Why it is shaped so:

1. Limits are set here, inside the sandbox, not before `bwrap` starts: `RLIMIT_NPROC` counts the
   processes of the sandbox's own user namespace only when it is set after that namespace exists
   (set earlier, it would count every process of the user on the host).
2. Inside the sandbox this runner is PID 1 of its PID namespace (`bwrap --as-pid-1`). The code runs
   in a forked child; when that child ends, PID 1 exits, and the kernel kills every other process
   of the namespace: background, `setsid` and double-forked children included. PID 1 cannot be
   killed from inside, so the code cannot end the run while leaving processes behind.
3. A bare final expression is evaluated separately and its value printed, as a notebook does.
"""

from __future__ import annotations

import _ast  # the C node types: the `ast` module costs tens of ms to import, on every call
import os
import resource
import signal
import sys
from types import CodeType, ModuleType, TracebackType

SOURCE = "main.py"
ONLY_AST = 0x400  # ast.PyCF_ONLY_AST
OPEN_FILES = 256
"""Descriptors per process: plenty for a program, and no thousands of memfds or sockets."""


def set_limits(memory: int, processes: int, file_size: int, cpu_seconds: int) -> None:
    """Cap address space, processes (0: no cap), file size, CPU time and open files; hard too."""
    caps = [
        (resource.RLIMIT_AS, memory),
        (resource.RLIMIT_NOFILE, OPEN_FILES),
        (resource.RLIMIT_FSIZE, file_size),
        (resource.RLIMIT_CPU, cpu_seconds),
        (resource.RLIMIT_CORE, 0),
    ]
    if processes > 0:
        caps.append((resource.RLIMIT_NPROC, processes))
    for which, value in caps:
        resource.setrlimit(which, (value, value))


def compile_cell(source: str) -> tuple[CodeType, CodeType | None]:
    """Compile the program; a bare last expression is compiled apart, to show its value."""
    tree = compile(source, SOURCE, "exec", ONLY_AST, dont_inherit=True)
    last = None
    if tree.body and isinstance(tree.body[-1], _ast.Expr):
        last = compile(_ast.Expression(tree.body.pop().value), SOURCE, "eval", dont_inherit=True)
    return compile(tree, SOURCE, "exec", dont_inherit=True), last


def user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Skip this runner's own frames, so a traceback starts in the user's program."""
    while tb is not None and tb.tb_frame.f_code.co_filename != SOURCE:
        tb = tb.tb_next
    return tb


def run_cell() -> int:
    """Run `main.py` in a fresh `__main__` module; print a bare last expression's value."""
    sys.stdout.reconfigure(encoding="utf-8", errors="backslashreplace")  # type: ignore[union-attr]
    module = ModuleType("__main__")
    module.__file__ = SOURCE
    sys.modules["__main__"], sys.argv = module, [SOURCE]  # pickle finds the program's functions
    namespace = module.__dict__
    try:
        with open(SOURCE, encoding="utf-8") as handle:
            body, last = compile_cell(handle.read())
        exec(body, namespace)
        value = eval(last, namespace) if last is not None else None
        if value is not None:
            print(repr(value))
    except SystemExit:
        raise
    except BaseException as exc:
        import traceback  # only when needed: it is slow to import

        traceback.print_exception(type(exc), exc, user_frames(exc.__traceback__))
        return 1
    return 0


def supervise(child: int) -> int:
    """As PID 1: reap every orphan until the program's own process ends; return its status."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        pid, status = os.wait()
        if pid == child:
            return os.waitstatus_to_exitcode(status)


def main(argv: list[str]) -> None:
    """Set the limits, extend the import path, then run the cell (forked when PID 1)."""
    memory, processes, file_size, cpu_seconds = (int(value) for value in argv[:4])
    set_limits(memory, processes, file_size, cpu_seconds)
    sys.path.extend(path for path in argv[4:] if path)
    if os.getpid() == 1:
        child = os.fork()
        if child:
            code = supervise(child)
            os._exit(code if code >= 0 else 128 - code)
    sys.exit(run_cell())


if __name__ == "__main__":
    main(sys.argv[1:])
