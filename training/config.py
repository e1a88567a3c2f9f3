"""One configuration for Flow-GRPO training: TRL's knobs passed through, plus the flow's."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints


def _help(text: str, default: Any) -> Any:
    return field(default=default, metadata={"help": text})


@dataclass(kw_only=True)
class TrainConfig:
    """Everything a Flow-GRPO run needs; defaults follow the paper where they fit one GPU."""

    # Models
    planner: str | None = _help("Model to train: hub id, folder or .gguf; default: SmolLM2.", None)
    engine: str | None = _help(
        "Fixed engine: a model name, 'base' (the frozen base under LoRA), or unset for a "
        "separate frozen copy of the planner's model.",
        None,
    )
    device: str | None = _help("cpu, cuda, ...; default: CUDA when available.", None)
    # Data
    benchmark: str | None = _help("Registered benchmark to train on (e.g. gameof24).", None)
    data: str | None = _help("A .json/.jsonl/.parquet file of cases to train on.", None)
    scorer: str | None = _help("Scorer for --data (exact_match, math_equal, game24, ...).", None)
    limit: int | None = _help("Use only the first N questions.", None)
    trajectories: str | None = _help(
        "Offline mode: train from an exported trajectory file (.jsonl/.parquet) instead.", None
    )
    # Flow
    group_size: int = _help("G, rollouts per question (paper: 8).", 8)
    questions_per_step: int = _help("Q, questions per update (paper: 32 on 8 GPUs).", 4)
    max_turns: int = _help("Planner turns per rollout (paper: 3 in training).", 3)
    tools: list[str] | None = field(
        default=None, metadata={"help": "Tool names to enable; default: all default tools."}
    )
    corpus: str | None = _help("JSONL corpus for local_search.", None)
    planner_temperature: float = _help("Sampling temperature of rollouts and of TRL.", 0.7)
    planner_max_new_tokens: int = _help("Planner tokens per turn (paper: 2048).", 512)
    engine_max_new_tokens: int = _help("Fixed engine tokens per call.", 384)
    mode: Literal["paper", "official", "sequence"] = _help("Flow-GRPO weighting mode.", "paper")
    scale: Literal["group", "batch", "none"] = _help("Advantage scaling.", "group")
    drop_zero_variance: bool = _help("Drop groups whose rewards are all equal.", False)
    reward_errors: Literal["zero", "drop"] = _help(
        "A rollout whose scorer failed trains with reward 0 (zero) or is left out (drop).", "zero"
    )
    format_penalty: float = _help("Penalty weight for unparseable planner turns.", 0.0)
    step_credit_weight: float = _help(
        "GiGPO-style step credit weight, beyond the paper; 0 turns it off.", 0.0
    )
    step_credit_gamma: float = _help("Discount of the step-credit returns.", 0.95)
    # TRL / optimisation
    output_dir: str = _help("Where checkpoints, logs and the final policy go.", "runs/train")
    learning_rate: float = _help("Learning rate (paper: 1e-6).", 1e-6)
    beta: float = _help("KL coefficient against the reference (paper: 0.001).", 0.001)
    epsilon: float = _help("Lower clip range (paper: 0.2).", 0.2)
    epsilon_high: float = _help("Upper clip range (official code: 0.3).", 0.3)
    max_steps: int = _help("Updates to run (paper: about 32).", 32)
    logging_steps: int = _help("Log every N steps.", 1)
    save_steps: int = _help("Checkpoint every N steps.", 10)
    report_to: str = _help("TRL/transformers reporting: none, tensorboard, wandb, ...", "none")
    seed: int = _help("Seed for data order, sampling and initialisation.", 0)
    bf16: bool | None = _help("bf16 training; default: on with CUDA.", None)
    gradient_checkpointing: bool = _help("Trade compute for memory.", False)
    lora: bool | None = _help("Train a LoRA adapter; default: on above 1B parameters.", None)
    lora_r: int = _help("LoRA rank.", 16)
    lora_alpha: int = _help("LoRA alpha.", 32)
    resume: bool = _help("Continue from the last checkpoint in output_dir.", False)

    def __post_init__(self) -> None:
        if self.trajectories and (self.benchmark or self.data):
            raise ValueError(
                "trajectories (offline) and benchmark/data (online) exclude each other; give one"
            )
        if not self.trajectories and bool(self.benchmark) == bool(self.data):
            raise ValueError("give exactly one of benchmark or data (or trajectories)")
        if self.engine == "base" and self.lora is False:
            raise ValueError("engine 'base' is the frozen base under LoRA; it needs lora on")
        for name in ("group_size", "questions_per_step", "max_turns", "max_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Build from a dict (a YAML file), rejecting unknown keys with the known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config keys {unknown}; known keys: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_yaml(cls, path: str | Path) -> TrainConfig:
        """Read a YAML file of config keys."""
        return cls.from_dict(read_yaml(path))


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Return the mapping of config keys in a YAML file."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of config keys")
    return data


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """Add one `--flag` per config field (help text from the field), all defaulting to unset."""
    hints = get_type_hints(TrainConfig)
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind, help_text = hints[f.name], f.metadata["help"]
        options = [a for a in get_args(kind) if a is not type(None)] or [kind]
        base = options[0]
        if get_origin(kind) is Literal:
            parser.add_argument(
                flag, choices=[str(a) for a in get_args(kind)], default=None, help=help_text
            )
        elif base is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
        elif get_origin(base) is list:
            parser.add_argument(
                flag, type=_comma_list, default=None, help=help_text + " (comma-separated)"
            )
        else:
            parser.add_argument(flag, type=base, default=None, help=help_text)


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Merge a YAML `--config` file with flags (flags win) into a validated config."""
    base = read_yaml(args.config) if args.config is not None else {}
    flags = {
        f.name: getattr(args, f.name)
        for f in fields(TrainConfig)
        if getattr(args, f.name, None) is not None
    }
    return TrainConfig.from_dict({**base, **flags})
