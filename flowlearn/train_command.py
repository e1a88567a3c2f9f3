"""`flowlearn train`: Flow-GRPO training from a YAML config and/or flags, parsed by TRL."""

from __future__ import annotations

import argparse
import os
from typing import Any

from flowlearn.errors import FlowlearnError, UsageError


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
    from flowlearn.config_keys import unknown_flags, unknown_keys_message

    unknown = unknown_flags(args.options)  # before TRL (and torch) load: a typo fails at once
    if unknown:
        raise UsageError(unknown_keys_message(unknown))
    from flowlearn.compose import build_training_parts
    from flowlearn.training.config import parse_config
    from flowlearn.training.offline import fit_offline_shape
    from flowlearn.training.run import check_run, claim_output_dir, resume_point, train

    main_process = os.environ.get("RANK", "0") == "0"  # under `accelerate launch`, it says it
    try:
        config = parse_config(args.options)
        config.check_questions_named()
        resume_from = resume_point(config)  # checked before any model is loaded
        config, fitted = fit_offline_shape(config, args.options)  # G from --trajectories
        for line in fitted if main_process else ():
            print(line)
        resuming = config.resume or resume_from is not None
        check_run(config, resuming=resuming)  # stored rollouts
        claim_output_dir(config, resuming=resuming, create=False)  # checked, nothing written
    except FlowlearnError:
        raise  # its own kind: a bad record in --trajectories is a data error, not a usage one
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    if config.dry_run:  # validated as a run is; the estimate reads the model's config alone
        from flowlearn.training.dry_run import report

        if main_process:
            print(report(config))
        return 0
    # an adapter the planner_url server refused is a ModelError: the CLI says why, no trace
    final = train(config, build_training_parts(config), resume_from=resume_from)
    if main_process:
        print(f"final policy: {final} (use it: flowlearn run QUESTION --planner {final})")
    return 0
