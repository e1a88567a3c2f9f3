"""The tiny-model trainer setup shared by the online and offline trainer tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from offline_setup import config as offline_config
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from flowlearn.graphs import Context


def config(tmp_path: Path, **overrides: Any) -> GRPOConfig:
    """The shared offline config (fp32, so TRL's logprobs match the logged ones to float
    precision), with 2 steps at lr 1e-3 and a 16-token budget."""
    values: dict[str, Any] = {"max_steps": 2, "learning_rate": 1e-3, "max_completion_length": 16}
    return offline_config(tmp_path, **{**values, **overrides})


def load(tiny_model_dir: Path) -> tuple[Any, Any]:
    return (
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )


# planner_max_new_tokens is max_completion_length: training refuses two values for one budget
CONTEXT = Context(max_turns=2, planner_temperature=0.7, planner_max_new_tokens=16)
