"""Config values are checked by type, choice and range, from YAML and from flags, key named."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

pytest.importorskip("trl")

from flowlearn.training.config import FlowGRPOConfig, parse_config
from flowlearn.training.config_checks import Range, describe


def from_yaml(tmp_path: Path, line: str) -> FlowGRPOConfig:
    path = tmp_path / "train.yaml"
    path.write_text(f"benchmark: gameof24\noutput_dir: {tmp_path / 'out'}\n{line}\n")
    return parse_config(["--config", str(path)])


@pytest.mark.parametrize(
    ("line", "key", "value"),
    [
        ("learning_rate: 1e-6", "learning_rate", 1e-6),  # PyYAML reads this as a string
        ("learning_rate: '3e-5'", "learning_rate", 3e-5),
        ("max_steps: 3.0", "max_steps", 3),
        ("max_steps: '7'", "max_steps", 7),
        ("temperature: 1", "temperature", 1.0),
        ("top_p: 1", "top_p", 1.0),
        ("tools: python", "tools", ["python"]),
        ("scale_rewards: false", "scale_rewards", "none"),  # TRL's old boolean spelling
        ("recompute_old_logprobs: true", "recompute_old_logprobs", True),
        ("lora: null", "lora", None),
    ],
)
def test_good_yaml_values_arrive_as_their_type(
    tmp_path: Path, line: str, key: str, value: object
) -> None:
    got = getattr(from_yaml(tmp_path, line), key)
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("mode: bogus", "mode must be one of 'paper', 'verl_like', 'sequence', got 'bogus'"),
        ("mode: official", "mode 'official' is now 'verl_like'"),  # renamed: what differs
        ("reward_errors: keep", "reward_errors must be one of 'zero', 'drop'"),
        ("scale_rewards: always", "scale_rewards must be one of 'group', 'batch', 'none'"),
        ("importance_sampling_level: word", "importance_sampling_level must be one of"),
        ("lr_scheduler_type: wobbly", "lr_scheduler_type must be one of 'linear', 'cosine'"),
        ("temperature: .nan", "temperature must be a finite number, got nan"),
        ("temperature: .inf", "temperature must be a finite number, got inf"),
        ("temperature: -0.7", "temperature must be in (0, 10], got -0.7"),
        ("temperature: 0", "temperature must be in (0, 10], got 0"),
        ("temperature: true", "temperature must be a finite number, got True"),
        ("temperature: null", "temperature must be a finite number, got None"),
        ("top_p: 1.5", "top_p must be in (0, 1], got 1.5"),
        ("top_p: 0", "top_p must be in (0, 1], got 0"),
        ("max_steps: 2.5", "max_steps must be a whole number, got 2.5"),
        ("num_generations: 1.5", "num_generations must be a whole number or null, got 1.5"),
        ("questions_per_step: 0", "questions_per_step must be in [1, 100000], got 0"),
        ("max_completion_length: -4", "max_completion_length must be in [1, 131072], got -4"),
        ("learning_rate: -1.0e-6", "learning_rate must be >= 0, got -1e-06"),
        ("learning_rate: fast", "--learning_rate/--learning-rate: invalid float value: 'fast'"),
        ("beta: -0.001", "beta must be >= 0, got -0.001"),
        ("epsilon_high: .nan", "epsilon_high must be a finite number or null, got nan"),
        ("step_credit_gamma: 1.5", "step_credit_gamma must be in [0, 1], got 1.5"),
        ("seed: -1", "seed must be >= 0, got -1"),
        ("lora: 1", "lora must be true or false or null, got 1"),
        ("planner: 5", "planner must be a string or null, got 5"),
        ("tools: [python, 3]", "tools must be a list of (a string) or null"),
    ],
)
def test_bad_yaml_values_are_refused_with_the_key_named(
    tmp_path: Path, line: str, message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        from_yaml(tmp_path, line)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--temperature", "nan"], "temperature must be a finite number, got nan"),
        (["--temperature", "-1"], "temperature must be in (0, 10], got -1.0"),
        (["--top_p", "0"], "top_p must be in (0, 1], got 0.0"),
        (["--beta", "-1"], "beta must be >= 0"),
        (["--max_steps", "2.5"], "--max_steps"),  # argparse's int refuses it, naming the flag
        (["--mode", "bogus"], "--mode"),
        (["--mode", "official"], "mode 'official' is now 'verl_like'"),
        (["--learning_rate", "inf"], "learning_rate must be a finite number, got inf"),
    ],
)
def test_bad_flag_values_are_refused_with_the_key_named(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_config(["--benchmark", "gameof24", *flags])
    assert message in str(caught.value)


def test_flags_win_over_yaml_and_are_checked_too(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("benchmark: gameof24\nlearning_rate: 1e-6\ntemperature: 0.5\n")
    config = parse_config(["--config", str(path), "--temperature", "0.6"])
    assert (config.learning_rate, config.temperature) == (1e-6, 0.6)
    with pytest.raises(ValueError, match=r"temperature must be in \(0, 10\]"):
        parse_config(["--config", str(path), "--temperature", "-0.6"])


def test_programmatic_configs_are_checked_the_same_way(tmp_path: Path) -> None:
    config = FlowGRPOConfig(benchmark="gameof24", output_dir=str(tmp_path), learning_rate="1e-6")  # type: ignore[arg-type]
    assert config.learning_rate == 1e-6 and isinstance(config.learning_rate, float)
    with pytest.raises(ValueError, match=r"max_turns must be a whole number, got 1\.5"):
        FlowGRPOConfig(benchmark="gameof24", output_dir=str(tmp_path), max_turns=1.5)  # type: ignore[arg-type]


def test_the_defaults_pass_and_new_defaults_hold(tmp_path: Path) -> None:
    config = from_yaml(tmp_path, "")
    assert config.disable_dropout is True and config.recompute_old_logprobs is False
    assert math.isfinite(config.learning_rate)


def test_ranges_and_annotations_read_as_written() -> None:
    assert Range(0, 1, low_open=True).text() == "in (0, 1]"
    assert Range(0, low_open=True).text() == "> 0"
    assert not Range(0, 1, low_open=True).holds(0) and Range(0, 1, low_open=True).holds(1)
    assert describe(int | None) == "a whole number or null"


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("generation_kwargs: {num_beams: 2}", "generation_kwargs"),
        ("top_k: 5", "top_k"),
        ("cache_implementation: static", "cache_implementation"),
        ("use_transformers_continuous_batching: true", "use_transformers_continuous_batching"),
        ("use_transformers_paged: true", "use_transformers_paged"),  # TRL's old name
        ("transformers_continuous_batching_config: {block_size: 64}", "transformers_continuous"),
        ("chat_template_kwargs: {enable_thinking: false}", "chat_template_kwargs"),
        ("max_tool_calling_iterations: 4", "max_tool_calling_iterations"),
        ("multi_objective_aggregation: normalize_then_sum", "multi_objective_aggregation"),
        ("log_completions: true", "log_completions"),
        ("num_generations_eval: 4", "num_generations_eval"),
        ("trust_remote_code: true", "trust_remote_code"),
    ],
)
def test_trl_settings_the_flow_cannot_honour_are_refused_not_ignored(
    tmp_path: Path, line: str, key: str
) -> None:
    """TRL options that act in its own generation and scoring, which the flow replaces."""
    with pytest.raises(ValueError, match=rf"{key}.*not supported yet"):
        from_yaml(tmp_path, line)
