"""The shipped recipes (examples/recipes) parse, and `flowlearn train --dry-run` reports on them.

The dry run reads the planner's shape from a local config.json with Qwen2.5-7B-Instruct's real
numbers (the hub's is not available offline) and loads no weights; its memory figures are
checked against a hand computation.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from flowlearn.cli import main
from flowlearn.training.config import parse_config

ROOT = Path(__file__).parents[2]
RECIPES = sorted((ROOT / "examples" / "recipes").glob("*.yaml"))
QWEN_7B = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "max_position_embeddings": 32768,
}
GIB = 1024**3


def qwen_7b_parameters() -> int:
    """Qwen2.5-7B by hand: 28 layers of q/k/v/o (+ q/k/v bias), a gated MLP, two norms."""
    h, layers, kv, i, vocab = 3584, 28, 4 * 128, 18944, 152064  # kv: 4 heads of 128
    attention = h * h + 2 * h * kv + h * h + (h + 2 * kv)
    layer = attention + 3 * h * i + 2 * h
    return layers * layer + 2 * vocab * h + h  # embedding and untied head, final norm


@pytest.fixture
def planner(tmp_path: Path) -> Path:
    folder = tmp_path / "qwen2.5-7b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN_7B))
    return folder


def test_there_are_the_two_recipes() -> None:
    names = {p.name for p in RECIPES}
    assert {"agentflow_7b_lora_1gpu.yaml", "agentflow_7b_full_8gpu.yaml"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_each_recipe_is_a_valid_config_with_the_official_hyperparameters(recipe: Path) -> None:
    config = parse_config(["--config", str(recipe)])
    assert config.planner == "Qwen/Qwen2.5-7B-Instruct"
    assert (config.beta, config.epsilon, config.epsilon_high) == (0.001, 0.2, 0.3)
    assert (config.num_generations, config.max_turns, config.temperature) == (8, 3, 0.7)
    assert Path(str(config.data)).is_file() and Path(str(config.corpus)).is_file()
    processes = 8 if config.use_vllm else 1  # the 8-GPU recipe's Q counts each process's
    assert config.questions_per_step * processes == 32
    assert "Departures" in recipe.read_text()  # every departure listed, with why


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_dry_run_prints_the_sections_and_writes_nothing(
    recipe: Path, planner: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = ["--config", str(recipe), "--planner", str(planner), "--output_dir", str(out)]
    assert main(["train", *argv, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    for section in ("config valid", "step (per process", "GPU memory per device", "writes under"):
        assert section in printed
    assert f"{qwen_7b_parameters():,} parameters" in printed
    assert not out.exists()


def test_dry_run_memory_of_the_lora_recipe_is_the_hand_computation(
    planner: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    recipe = ROOT / "examples" / "recipes" / "agentflow_7b_lora_1gpu.yaml"
    argv = ["--config", str(recipe), "--planner", str(planner), "--output_dir", str(tmp_path / "o")]
    assert main(["train", *argv, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    weights = qwen_7b_parameters() * 2  # bf16 base under LoRA
    per_layer_lora = 16 * ((3584 + 3584) * 2 + (3584 + 512) * 2 + (3584 + 18944) * 3)
    adapter = 28 * per_layer_lora * (4 + 4 + 8)  # fp32 weight, gradient, two AdamW moments
    kv = 64 * (2048 + 2048) * (28 * 2 * 4 * 128 * 2)  # concurrency x tokens x bytes a token
    assert f"weights: {weights / GIB:.2f} GiB" in printed
    assert f"LoRA adapter, gradients, AdamW (fp32): {adapter / GIB:.2f} GiB" in printed
    assert f"KV cache: {kv / GIB:.2f} GiB" in printed
    assert f"total: {(weights + adapter + kv) / GIB:.2f} GiB" in printed
    assert "rollouts: 256 (32 questions x 8 generations)" in printed
    assert f"planner tokens: {256 * 3 * 2048:,}" in printed


def test_dry_run_memory_of_the_full_recipe_is_the_hand_computation(
    planner: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    recipe = ROOT / "examples" / "recipes" / "agentflow_7b_full_8gpu.yaml"
    argv = ["--config", str(recipe), "--planner", str(planner), "--output_dir", str(tmp_path / "o")]
    assert main(["train", *argv, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    fp32 = qwen_7b_parameters() * 4  # weights, gradients, reference; AdamW twice that
    engine = qwen_7b_parameters() * 2  # the frozen bf16 engine copy
    assert f"weights: {fp32 / GIB:.2f} GiB" in printed
    assert f"AdamW moments: {2 * fp32 / GIB:.2f} GiB" in printed
    assert f"total: {(5 * fp32 + engine) / GIB:.2f} GiB" in printed
    sharded = 3 * (fp32 // 8) + (2 * fp32) // 8 + engine  # all but the engine over 8
    assert f"over 8 processes (FSDP full shard or ZeRO-3): {sharded / GIB:.2f} GiB" in printed
    assert "KV cache:" not in printed  # in vLLM's reservation
    assert "final-adapter" not in printed


def test_dry_run_without_a_readable_model_config_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    recipe = ROOT / "examples" / "recipes" / "agentflow_7b_lora_1gpu.yaml"
    missing = tmp_path / "no-model"
    argv = ["--config", str(recipe), "--planner", str(missing), "--output_dir", str(tmp_path / "o")]
    assert main(["train", *argv, "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "GPU memory per device: not estimated: the config of" in printed
    assert "rollouts: 256" in printed
