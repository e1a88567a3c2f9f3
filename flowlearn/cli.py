"""The `flowlearn` command line: `run` a question, `eval` a benchmark, `collect` rollouts, `train`.

Why it looks like this:

1. Only the command named on the line is imported, so `flowlearn train --nonsense` is refused
   before torch, transformers or TRL load (a second, not a minute under load).
2. A usage error is one line and a hint (`CommandParser.error`), not the whole usage.
3. The libraries' loading bars and warnings are the user's business only under `--verbose`
   (`library_output`); flowlearn's own progress bars and warnings always show.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from flowlearn.errors import FlowlearnError, UsageError
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


class CommandParser(argparse.ArgumentParser):
    """argparse's parser whose usage error is one line with a hint, not the whole usage."""

    def error(self, message: str) -> NoReturn:
        """Print `PROG: error: MESSAGE (see `PROG --help`)` and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Return the parser of every subcommand (`only`: that one whole, the others named only)."""
    parser = CommandParser(
        prog="flowlearn", description="Agent workflows that learn from their own runs."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).add_parser(commands)
        else:  # never parsed: the line names another command
            commands.add_parser(name)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (2 for bad options, 1 for other errors)."""
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
        print(f"flowlearn {args.command}: error: {redact(str(exc))}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1


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
