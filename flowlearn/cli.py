"""The `flowlearn` command line: `run` a question, `eval` a benchmark, `collect` rollouts, `train`.

Why it looks like this:

1. Only the command named on the line is imported, so `flowlearn train --nonsense` is refused
   before torch, transformers or TRL load (a second, not a minute under load).
2. A usage error is one line and a hint (`CommandParser.error`), not the whole usage.
3. The libraries' loading bars and warnings are the user's business only under `--verbose`
   (`library_output`); flowlearn's own progress bars and warnings always show.
4. An error flowlearn raises on purpose is one line, `flowlearn CMD: KIND: message`, and its kind's
   exit status (`ERROR_KINDS`), so a script can tell bad options from bad data, an unusable model
   or a failure worth retrying; its traceback shows only under `--verbose`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from flowlearn.errors import (
    DataError,
    FlowlearnError,
    ModelError,
    SetupError,
    TrainingError,
    TransientError,
    UsageError,
)
from flowlearn.secrets import redact

COMMANDS = {
    "run": "flowlearn.run_command",
    "eval": "flowlearn.eval_command",
    "collect": "flowlearn.collect_command",
    "train": "flowlearn.train_command",
    "serve": "flowlearn.serve_command",
}
"""Each subcommand and its module: `add_parser(commands)` registers it, `<name>_command(args)`
runs it."""

QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # download and "Loading weights" bars (transformers')
    "TRANSFORMERS_VERBOSITY": "error",  # its info and advisory warnings
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
}
"""The libraries' own switches, read when they are imported; a value the user set is kept."""

QUIET_LIBRARIES = ("transformers", "trl", "peft", "accelerate", "torch", "huggingface_hub")
"""Libraries whose Python warnings (FutureWarning, UserWarning, ...) only `--verbose` shows."""


@dataclass(frozen=True)
class ErrorKind:
    """How the command line reports one kind of error: its exit status and its line's words."""

    error: type[FlowlearnError]
    """The kind (`flowlearn.errors`); its subclasses are reported the same way."""
    status: int
    """The exit status (sysexits.h's where one means the same)."""
    label: str
    """The line's word for it: `flowlearn CMD: LABEL: message`."""
    meaning: str
    """What it means, for `flowlearn --help` and docs/cli.md."""
    hint: str = ""
    """Added after the message: what to do that the message cannot know."""


ERROR_KINDS = (
    ErrorKind(UsageError, 2, "error", "a bad option, name or config value"),  # argparse's too
    ErrorKind(DataError, 65, "data error", "a data file holds a record flowlearn must not use"),
    ErrorKind(
        ModelError, 69, "model error", "a model, adapter, checkpoint or server cannot be used"
    ),
    ErrorKind(TrainingError, 70, "training stopped", "training met a non-finite value and stopped"),
    ErrorKind(
        TransientError,
        75,
        "temporary error",
        "a failure worth retrying outlasted its retries",
        hint=" (temporary: run the command again; eval and collect resume where they stopped)",
    ),
    ErrorKind(SetupError, 78, "setup error", "this machine lacks something (a sandbox, vLLM)"),
)
"""Each kind of error the command line tells apart; the first that the error is wins."""

OTHER_ERROR = ErrorKind(FlowlearnError, 1, "error", "any other error flowlearn raised on purpose")
"""A `FlowlearnError` of no kind above."""


def error_kind(exc: FlowlearnError) -> ErrorKind:
    """Return how the command line reports `exc`."""
    return next((k for k in ERROR_KINDS if isinstance(exc, k.error)), OTHER_ERROR)


def report_error(exc: FlowlearnError, command: str, *, verbose: bool) -> int:
    """Print `exc` as one line (its traceback before it under `verbose`); return its status."""
    kind = error_kind(exc)
    if verbose:
        print(redact("".join(traceback.format_exception(exc))), end="", file=sys.stderr)
    message = " ".join(redact(str(exc)).splitlines())
    print(f"flowlearn {command}: {kind.label}: {message}{kind.hint}", file=sys.stderr)
    return kind.status


class CommandParser(argparse.ArgumentParser):
    """argparse's parser whose usage error is one line with a hint, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        """Print `PROG: error: MESSAGE (see `PROG --help`)` and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Return the parser of every subcommand (`only`: that one whole, the others named only)."""
    parser = CommandParser(
        prog="flowlearn",
        description="Agent workflows that learn from their own runs.",
        epilog=exit_statuses(),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the table's lines as written
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(commands)
        else:  # never parsed: the line names another command
            commands.add_parser(name)
    return parser


def exit_statuses() -> str:
    """Return the table of exit statuses that `flowlearn --help` ends with."""
    kinds = sorted((*ERROR_KINDS, OTHER_ERROR), key=lambda kind: kind.status)
    rows = [f"  {k.status:<3} {k.error.__name__:<15} {k.meaning}" for k in kinds]
    return "\n".join(["exit status:", "  0   done", *rows])


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (`ERROR_KINDS`'s for an error)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    named = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(named if named in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra:  # told by the subcommand's parser, so its hint names its own --help
        subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        subparsers.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    handler = getattr(importlib.import_module(COMMANDS[args.command]), f"{args.command}_command")
    # `train` hands its options to TRL's parser, which reads `--verbose` into the config
    verbose = getattr(args, "verbose", None) or "--verbose" in getattr(args, "options", ())
    try:
        with library_output(verbose=bool(verbose)):
            return int(handler(args))
    except FlowlearnError as exc:  # a message that says what to fix, not a traceback
        return report_error(exc, args.command, verbose=bool(verbose))


@contextlib.contextmanager
def library_output(*, verbose: bool) -> Iterator[None]:
    """Silence, for one command, the libraries' loading bars and warnings (unless `verbose`).

    Through the libraries' own switches: the environment they read on import, transformers'
    logging switches when it is already imported, and warning filters scoped to the named
    libraries' modules. Everything is put back afterwards.
    """
    if verbose:
        yield
        return
    saved = {key: os.environ.get(key) for key in QUIET_ENV}
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    hf_logging: Any = sys.modules.get("transformers.utils.logging")
    before = None
    if hf_logging is not None:
        before = (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled())
    with warnings.catch_warnings():
        for library in QUIET_LIBRARIES:
            warnings.filterwarnings("ignore", module=rf"{library}(\.|$)")
        try:
            quiet_transformers()
            yield
        finally:
            for key, was in saved.items():
                if was is None:
                    os.environ.pop(key, None)
            if before is not None:  # imported before the command: put back as it was
                restore_transformers(before)


def quiet_transformers() -> None:
    """Turn transformers' logs to errors only and its progress bars off, if it is imported."""
    hf_logging: Any = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()


def restore_transformers(before: tuple[int, bool]) -> None:
    """Put transformers' verbosity and progress bars back as they were."""
    hf_logging: Any = sys.modules["transformers.utils.logging"]
    verbosity, bars = before
    hf_logging.set_verbosity(verbosity)
    if bars:
        hf_logging.enable_progress_bar()
