"""Red-team attacks on `--resume`: an edited step is refused, an extended run keeps learning."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

from offline_setup import sampled
from trainer_setup import CONTEXT, config, load

from flowlearn.cli import main
from flowlearn.engine.local import HFPolicy
from flowlearn.training.config import parse_config
from flowlearn.training.run import resume_point
from flowlearn.training.schedule import check_resumed_step
from flowlearn.training.trainer import FlowGRPOTrainer


def offline_trainer(model_dir: Path, tmp_path: Path, trajectories: Any, **args: Any) -> Any:
    model, tokenizer = load(model_dir)
    return FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, **args),
        trajectories=trajectories,
        context=CONTEXT,
        processing_class=tokenizer,
    )


def logged_rates(trainer: Any) -> dict[int, float]:
    return {h["step"]: h["learning_rate"] for h in trainer.state.log_history if "loss" in h}


@pytest.mark.slow
def test_extending_a_finished_run_trains_the_added_steps_at_a_positive_rate(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer = load(tiny_model_dir)
    trajectories = sampled(HFPolicy(model, tokenizer))
    saving = {"save_strategy": "steps", "save_steps": 1}
    first = offline_trainer(tiny_model_dir, tmp_path, trajectories, max_steps=2, **saving)
    first.train()
    assert logged_rates(first)[2] > 0  # the linear schedule ends at 0 after step 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        extended = offline_trainer(tiny_model_dir, tmp_path, trajectories, max_steps=4, **saving)
        extended.train(resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-2"))
    rates = logged_rates(extended)  # the checkpoint's history, then the added steps
    assert sorted(rates) == [1, 2, 3, 4]
    # the schedule rebuilt for 4 steps: step 3 at lr * (4 - 2) / 4, step 4 at lr * (4 - 3) / 4
    assert rates[3] == pytest.approx(1e-3 * 2 / 4) and rates[4] == pytest.approx(1e-3 / 4)
    assert "learning rate 0" not in caplog.text
    # an edited step is refused where the trainer loads it, before any step is skipped
    state = tmp_path / "out" / "checkpoint-2" / "trainer_state.json"
    edited = json.loads(state.read_text())
    state.write_text(json.dumps({**edited, "global_step": 10**18}))
    again = offline_trainer(tiny_model_dir, tmp_path, trajectories, max_steps=6, **saving)
    with pytest.raises(ValueError, match=r"trainer_state.json: global_step 10{18} is not the st"):
        again.train(resume_from_checkpoint=str(state.parent))
    assert not (tmp_path / "out" / "checkpoint-6").exists()


def test_a_step_spent_at_learning_rate_0_is_told(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer = load(tiny_model_dir)
    trajectories = sampled(HFPolicy(model, tokenizer))
    trainer = offline_trainer(tiny_model_dir, tmp_path, trajectories, max_steps=1, warmup_steps=1)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert logged_rates(trainer)[1] == 0  # a linear warmup's first step
    assert "step 1 trains at learning rate 0: its rollouts cost their time" in caplog.text


def checkpoint(out: Path, name: str, step: object) -> Path:
    folder = out / name
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


@pytest.mark.parametrize(
    ("name", "step", "message"),
    [
        ("checkpoint-2", 10**18, "global_step 1000000000000000000 is not the step of checkpoint-2"),
        ("checkpoint-9", 9, "global_step 9 is past max_steps 4, so nothing would train; give"),
        ("checkpoint-2", -2, "global_step -2 is not a whole number >= 0"),
        ("checkpoint-2", True, "global_step True is not a whole number >= 0"),
        ("checkpoint-2", "2", "global_step 2 is not a whole number >= 0"),
    ],
)
def test_an_edited_global_step_is_refused_naming_file_and_field(
    tmp_path: Path, name: str, step: object, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    folder = checkpoint(out, name, step)
    with pytest.raises(ValueError, match=message):
        check_resumed_step(folder, 4)
    argv = ["--trajectories", str(tmp_path / "t.jsonl"), "--output_dir", str(out)]
    argv += ["--max_steps", "4"]
    with pytest.raises(ValueError, match=str(folder / "trainer_state.json")):
        resume_point(parse_config([*argv, "--resume_from_checkpoint", str(folder)]))
    # the CLI refuses before any model loads: exit 2, nothing written
    assert main(["train", *argv, "--resume_from_checkpoint", str(folder)]) == 2
    assert message in capsys.readouterr().err
    if isinstance(step, int) and step > 4:  # a number: `--resume` finds it as it stands
        assert main(["train", *argv, "--resume"]) == 2
        assert message in capsys.readouterr().err
    assert not (out / "final").exists()


def test_a_checkpoint_at_max_steps_resumes_to_its_final_policy_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = checkpoint(tmp_path, "checkpoint-4", 4)  # killed before final/ was written
    with caplog.at_level(logging.WARNING):
        assert check_resumed_step(folder, 4) == 4
    assert "at max_steps 4: nothing to train" in caplog.text


# Item 13: an offline file's group size ---------------------------------------------------


def test_offline_training_reads_the_group_size_of_its_file(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flowlearn.training.trajectories import TrajectoryStore

    model, tokenizer = load(tiny_model_dir)
    file = tmp_path / "g2.jsonl"
    store = TrajectoryStore(file)
    for trajectory in sampled(HFPolicy(model, tokenizer)):  # 2 questions x G=2, as collected
        store.append(trajectory)
    argv = ["train", "--trajectories", str(file), "--planner", str(tiny_model_dir)]
    argv += ["--max_steps", "1", "--max_completion_length", "12", "--bf16", "false"]
    argv += ["--report_to", "none", "--save_strategy", "no"]
    # without the flags (G 8 and 4 questions a step by default): the file says both
    assert main([*argv, "--output_dir", str(tmp_path / "out")]) == 0
    said = capsys.readouterr().out
    assert "(groups of up to 2 rollouts, 2 groups): num_generations 2, questions_per_step 2" in said
    assert (tmp_path / "out" / "final" / "config.json").exists()
    # a value given that cannot work: one line naming the flag, before any model loads
    refused = tmp_path / "refused"
    assert main([*argv, "--output_dir", str(refused), "--questions_per_step", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give --questions_per_step 2 or fewer" in err
    assert not refused.exists()


# Item 11: what a user's reward and answer functions return -------------------------------


@pytest.mark.parametrize("returned", ["1.0", True, b"1", [1.0]])
def test_a_reward_function_returning_other_than_a_number_is_refused(returned: object) -> None:
    from flowlearn.evals.cases import Case
    from flowlearn.training.rewards import RewardFunctions
    from flowlearn.training.trajectories import Trajectory

    case = Case("q", "Capital?", "Paris")
    trajectory = Trajectory("t", "q", "Capital?", "Paris", "paris", "paris", 0.0)

    def says_one(completions: list[str], **kwargs: Any) -> list[object]:
        return [returned]

    with pytest.raises(ValueError, match=r"says_one returned \w+ .*, not a number; return a float"):
        RewardFunctions.of(says_one, None).score_rollout(trajectory, case)
    import numpy

    def numpy_one(completions: list[str], **kwargs: Any) -> list[object]:
        return [numpy.float32(1.0)]

    assert RewardFunctions.of(numpy_one, None).score_rollout(trajectory, case)[0] == 1.0


def test_an_answer_that_is_not_text_is_refused_not_stored_as_its_repr() -> None:
    from flowlearn.evals.cases import Case
    from flowlearn.training.rollouts import run_rollout

    class Graph:
        def invoke(self, inputs: dict[str, Any], context: Any = None) -> dict[str, Any]:
            return {"question": inputs["question"], "answer": object(), "transitions": []}

    def scorer(answer: str, case: Case) -> Any:
        raise AssertionError("never scored")

    with pytest.raises(TypeError, match="answer is of type object, not text: make the final"):
        run_rollout(Graph(), Case("q", "Capital?", "Paris"), 0, scorer)
