"""`flowlearn train`: Flow-GRPO training from a YAML config and/or flags."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from flowlearn.flow_setup import UsageError


def add_parser(commands: Any) -> None:
    """Register the `train` subcommand, one flag per `TrainConfig` field."""
    from flowlearn.training.config import add_config_flags

    parser = commands.add_parser(
        "train",
        help="train the planner with Flow-GRPO (TRL)",
        description="Train the planner with Flow-GRPO: online (rollouts through the flow on "
        "--benchmark/--data) or offline (--trajectories). Settings come from --config FILE.yaml "
        "and/or flags (flags win); unknown keys are errors.",
    )
    parser.add_argument("--config", type=Path, help="YAML file of config keys")
    add_config_flags(parser)


def train_command(args: argparse.Namespace) -> int:
    """Validate the config, train, and say where the final policy is."""
    from flowlearn.training.config import config_from_args

    try:
        config = config_from_args(args)
    except (ValueError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    from flowlearn.training.run import train

    final = train(config)
    if os.environ.get("RANK", "0") == "0":  # under `accelerate launch`, the main process says it
        print(f"final policy: {final} (use it: flowlearn run QUESTION --planner {final})")
    return 0
