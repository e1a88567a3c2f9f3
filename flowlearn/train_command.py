"""`flowlearn train`: Flow-GRPO training from a YAML config and/or flags, parsed by TRL."""

from __future__ import annotations

import argparse
import os
from typing import Any

from flowlearn.errors import AdapterError, UsageError


def add_parser(commands: Any) -> None:
    """Register `train`; its options are parsed later by TRL's parser, with trl imported.

    The subcommand takes every string after `train` as is (its prefix is no dash), so building
    the CLI stays light; `flowlearn train --help` lists every TRL and flow option.
    """
    parser = commands.add_parser(
        "train",
        help="train the planner with Flow-GRPO (TRL); `flowlearn train --help` lists the options",
        add_help=False,
        prefix_chars="\0",
    )
    parser.add_argument("options", nargs=argparse.REMAINDER)


def train_command(args: argparse.Namespace) -> int:
    """Validate the config, train, and say where the final policy is."""
    from flowlearn.compose import build_training_parts
    from flowlearn.training.config import parse_config
    from flowlearn.training.run import check_run, claim_output_dir, resume_point, train

    try:
        config = parse_config(args.options)
        config.check_questions_named()
        resume_from = resume_point(config)  # checked before any model is loaded
        resuming = config.resume or resume_from is not None
        check_run(config, resuming=resuming)  # stored rollouts
        claim_output_dir(config, resuming=resuming, create=False)  # checked, nothing written
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    try:
        final = train(config, build_training_parts(config), resume_from=resume_from)
    except AdapterError as exc:  # the planner_url server refused an adapter: say why, no trace
        raise UsageError(str(exc)) from exc
    if os.environ.get("RANK", "0") == "0":  # under `accelerate launch`, the main process says it
        print(f"final policy: {final} (use it: flowlearn run QUESTION --planner {final})")
    return 0
