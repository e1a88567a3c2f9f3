"""Red-team attacks on training's numbers: non-finite rewards on every read path, NaN updates."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from flowlearn.errors import DataError, TrainingDivergedError
from flowlearn.outputs import MARKER
from flowlearn.training.trajectories import (
    Trajectory,
    TrajectoryStore,
    export_parquet,
    load_trajectories,
)

# What a hostile or broken file can hold where a reward belongs, as JSON text: Python's json
# reads NaN, Infinity and 1e999 (which overflows) all as floats that are not finite.
BAD_REWARDS = ["NaN", "Infinity", "-Infinity", "1e999", '"1"', "true", "null", "[1]"]


def record(reward: str = "1.0", term: str = "0.0", index: int = 0) -> str:
    """One trajectory line with `reward` and a `format_penalty` term spliced in as raw JSON."""
    trajectory = Trajectory(
        trajectory_id=f"g/{index}",
        group_id="g",
        question="q",
        reference="r",
        answer="a",
        final_text="a",
        reward=0.5,
        reward_terms={"format_penalty": 0.25},
    )
    line = trajectory.to_json()
    line = line.replace('"reward": 0.5', f'"reward": {reward}')
    return line.replace('"format_penalty": 0.25', f'"format_penalty": {term}')


def write_file(path: Path, bad_line: str) -> Path:
    path.write_text(record(index=0) + "\n" + bad_line + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("bad", BAD_REWARDS)
def test_a_store_refuses_a_non_finite_reward_naming_file_line_and_field(
    tmp_path: Path, bad: str
) -> None:
    path = write_file(tmp_path / "t.jsonl", record(reward=bad, index=1))
    with pytest.raises(DataError, match=r"t\.jsonl:2: field reward = .* is not a finite number"):
        TrajectoryStore(path).load()
    with pytest.raises(DataError, match=r"t\.jsonl:2"):  # the offline trainer's reader
        load_trajectories(path)


@pytest.mark.parametrize("bad", ["NaN", "1e999", '"0"', "false"])
def test_a_non_finite_reward_term_is_refused_too(tmp_path: Path, bad: str) -> None:
    path = write_file(tmp_path / "t.jsonl", record(term=bad, index=1))
    with pytest.raises(DataError, match=r"t\.jsonl:2: field reward_terms\.format_penalty"):
        TrajectoryStore(path).load()


def test_a_non_finite_logged_logprob_is_refused(tmp_path: Path) -> None:
    data = json.loads(record(index=1))
    data["transitions"] = [{"node": "planner", "logprobs": [-0.5, float("nan")]}]
    path = write_file(tmp_path / "t.jsonl", json.dumps(data))
    with pytest.raises(DataError, match=r"t\.jsonl:2: field transitions\[0\]\.logprobs\[1\]"):
        TrajectoryStore(path).load()


def test_resuming_collection_refuses_a_poisoned_store(tmp_path: Path) -> None:
    """`collect` (and a resumed training run) reads its stored rollouts through the store."""
    from flowlearn.evals.cases import Case
    from flowlearn.evals.scorers import Score
    from flowlearn.training.rollouts import collect

    path = write_file(tmp_path / "t.jsonl", record(reward="NaN", index=1))
    before = path.read_bytes()
    with pytest.raises(DataError, match=r"t\.jsonl:2: field reward"):
        collect(
            lambda: SimpleNamespace(invoke=None),
            [Case("g", "q", "r")],
            lambda answer, case: Score(1.0),
            group_size=2,
            store=TrajectoryStore(path),
            progress=False,
        )
    assert path.read_bytes() == before  # nothing appended


@pytest.mark.parametrize("reward", [math.nan, math.inf])
def test_a_parquet_export_with_a_non_finite_reward_is_refused(
    tmp_path: Path, reward: float
) -> None:
    pytest.importorskip("pyarrow")
    good = Trajectory.from_dict(json.loads(record(index=0)))
    bad = Trajectory.from_dict(json.loads(record(index=1)))
    bad.reward = reward  # as a foreign writer could have put it there
    path = export_parquet([good, bad], tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t\.parquet: row 2: field reward"):
        load_trajectories(path)


def test_replay_and_rows_refuse_in_memory_non_finite_rewards() -> None:
    """Trajectories built in code (the Python API) are checked before any update too."""
    from flowlearn.training.rollouts import Replay
    from flowlearn.training.rows import build_flow_grpo_rows

    good = Trajectory.from_dict(json.loads(record(index=0)))
    bad = Trajectory.from_dict(json.loads(record(index=1)))
    bad.reward = math.nan
    with pytest.raises(DataError, match=r"'g/1': field reward = nan"):
        Replay.of([good, bad])
    with pytest.raises(DataError, match=r"'g/1': field reward = nan"):
        build_flow_grpo_rows([good, bad])
    bad.reward, bad.reward_terms = 1.0, {"format_penalty": math.inf}
    with pytest.raises(DataError, match=r"reward_terms\.format_penalty = inf"):
        TrajectoryStore("unused.jsonl").append(bad)


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "1e999", '"1"'])
def test_train_on_a_poisoned_trajectory_file_exits_naming_it_and_writes_nothing(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    pytest.importorskip("trl")
    from flowlearn.cli import main

    path = write_file(tmp_path / "poisoned.jsonl", record(reward=bad, index=1))
    out = tmp_path / "out"
    argv = ["train", "--planner", str(tiny_model_dir), "--trajectories", str(path)]
    status = main([*argv, "--output-dir", str(out), "--bf16", "false"])
    err = capsys.readouterr().err
    assert status == 65  # a data error
    assert "poisoned.jsonl:2: field reward" in err and "not a finite number" in err
    assert not (out / "final").exists()
    written = {p.name for p in out.iterdir()} if out.exists() else set()
    assert written <= {MARKER}  # nothing but the folder's run marker


def poisoned_trainer(tiny_model_dir: Path, tmp_path: Path) -> Any:
    pytest.importorskip("trl")
    from offline_setup import sampled
    from trainer_setup import CONTEXT, config, load

    from flowlearn.engine.local import HFPolicy
    from flowlearn.training.trainer import FlowGRPOTrainer

    model, tokenizer = load(tiny_model_dir)
    trajectories = sampled(HFPolicy(model, tokenizer))
    return FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, max_steps=2, max_completion_length=12),
        trajectories=trajectories,
        context=CONTEXT.__class__(max_turns=2, planner_temperature=0.7, planner_max_new_tokens=12),
        processing_class=tokenizer,
    )


@pytest.mark.slow
def test_training_stops_at_the_first_non_finite_loss(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch

    trainer = poisoned_trainer(tiny_model_dir, tmp_path)
    weight = trainer.model.get_input_embeddings().weight
    with torch.no_grad():  # what a diverged update leaves behind
        weight[:] = math.nan
    with pytest.raises(TrainingDivergedError, match=r"step 1: the loss is nan"):
        trainer.train()
    assert trainer.state.global_step == 0  # no update took it


def test_training_stops_at_a_non_finite_gradient_norm(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch

    trainer = poisoned_trainer(tiny_model_dir, tmp_path)
    for parameter in trainer.model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    next(trainer.model.parameters()).grad[0] = math.inf
    with pytest.raises(TrainingDivergedError, match=r"the gradient norm is inf"):
        trainer._get_grad_norm(trainer.model)  # where TRL's loop reads it, before the step


def test_a_policy_with_non_finite_weights_is_never_saved(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("trl")
    import torch
    from trainer_setup import load

    from flowlearn.training.run import save_final

    model, tokenizer = load(tiny_model_dir)
    with torch.no_grad():
        next(model.parameters())[0] = math.nan
    accelerator = SimpleNamespace(
        is_main_process=True, wait_for_everyone=lambda: None, unwrap_model=lambda m: m
    )
    trainer = SimpleNamespace(accelerator=accelerator, model=model)
    with pytest.raises(TrainingDivergedError, match="holds NaN or infinite values"):
        save_final(trainer, tokenizer, tmp_path / "final", merge=False)
    assert not any(tmp_path.iterdir())  # no final/, no staging folder
