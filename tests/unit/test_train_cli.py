from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from flowlearn.cli import main
from flowlearn.training.config import TrainConfig


def test_config_rejects_unknown_and_contradictory_keys(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"unknown config keys \['learning_rat'\]"):
        TrainConfig.from_dict({"benchmark": "gameof24", "learning_rat": 1e-5})
    with pytest.raises(ValueError, match="exclude each other"):
        TrainConfig(benchmark="gameof24", trajectories="t.jsonl")
    with pytest.raises(ValueError, match="exactly one of benchmark or data"):
        TrainConfig()
    with pytest.raises(ValueError, match="needs lora on"):
        TrainConfig(benchmark="gameof24", engine="base", lora=False)
    (tmp_path / "c.yaml").write_text("benchmark: gameof24\ngroup_size: 4\n")
    assert TrainConfig.from_yaml(tmp_path / "c.yaml").group_size == 4


def test_train_cli_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.yaml").write_text("benchmark: gameof24\nbogus: 1\n")
    assert main(["train", "--config", str(tmp_path / "c.yaml")]) == 2
    assert "unknown config keys ['bogus']" in capsys.readouterr().err
    assert main(["train", "--benchmark", "gameof24", "--group-size", "0"]) == 2
    assert "group_size must be >= 1" in capsys.readouterr().err


def questions_per_step(out: Path) -> dict[str, list[str]]:
    steps: dict[str, list[str]] = {}
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["trajectory_id"].split(":")[0], []).append(row["group_id"])
    return {step: sorted(set(groups)) for step, groups in steps.items()}


def test_lora_with_the_frozen_base_as_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "lora"
    assert (
        main(
            [
                "train",
                "--planner",
                str(tiny_model_dir),
                "--benchmark",
                "gameof24",
                "--limit",
                "2",
                "--group-size",
                "2",
                "--questions-per-step",
                "1",
                "--max-turns",
                "1",
                "--planner-max-new-tokens",
                "8",
                "--engine-max-new-tokens",
                "8",
                "--max-steps",
                "1",
                "--lora",
                "--engine",
                "base",
                "--beta",
                "0.01",
                "--no-bf16",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "final-adapter" / "adapter_config.json").exists()
    assert (out / "final" / "config.json").exists()
    rollout = json.loads((out / "rollouts.jsonl").read_text().splitlines()[0])
    assert rollout["transitions"][-1]["node"] == "generator"


def test_train_checkpoint_resume_and_final_policy_runs(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "train"
    config = tmp_path / "train.yaml"
    config.write_text(
        f"planner: {tiny_model_dir}\nbenchmark: gameof24\nlimit: 4\ngroup_size: 2\n"
        f"questions_per_step: 1\nmax_turns: 1\nplanner_max_new_tokens: 8\n"
        f"engine_max_new_tokens: 8\nlearning_rate: 0.001\nsave_steps: 1\nmax_steps: 2\n"
        f"output_dir: {out}\nbf16: false\n"
    )
    assert main(["train", "--config", str(config)]) == 0
    assert (out / "checkpoint-2").is_dir() and (out / "final" / "config.json").exists()
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert main(["train", "--config", str(config), "--max-steps", "3", "--resume"]) == 0
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    # The resumed run kept the data order: step by step, the same questions as a straight run.
    straight = tmp_path / "straight"
    assert (
        main(["train", "--config", str(config), "--max-steps", "3", "--output-dir", str(straight)])
        == 0
    )
    assert questions_per_step(out) == questions_per_step(straight)
    assert sorted(questions_per_step(out)) == ["step0", "step1", "step2"]
    capsys.readouterr()
    assert (
        main(
            [
                "run",
                "What is 2 + 2?",
                "--planner",
                str(out / "final"),
                "--max-steps",
                "1",
                "--max-new-tokens",
                "8",
                "--engine-max-new-tokens",
                "8",
            ]
        )
        == 0
    )
    assert "Answer:" in capsys.readouterr().out
