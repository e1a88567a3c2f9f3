"""The `flowlearn` command line: `run` a question, `eval` a benchmark, `collect` rollouts."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flowlearn import collect_command, eval_command, run_command, train_command
from flowlearn.errors import FlowlearnError, UsageError
from flowlearn.secrets import redact


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="flowlearn", description="Agent workflows that learn from their own runs."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run_command.add_parser(commands)
    eval_command.add_parser(commands)
    collect_command.add_parser(commands)
    train_command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (2 for bad options, 1 for other errors)."""
    args = build_parser().parse_args(argv)
    handlers = {
        "run": run_command.run_command,
        "eval": eval_command.eval_command,
        "collect": collect_command.collect_command,
        "train": train_command.train_command,
    }
    try:
        return handlers[args.command](args)
    except FlowlearnError as exc:  # a message that says what to fix, not a traceback
        print(f"flowlearn {args.command}: error: {redact(str(exc))}", file=sys.stderr)
        return 2 if isinstance(exc, UsageError) else 1
