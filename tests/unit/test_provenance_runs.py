"""Provenance of runs: runs have ids, stored rollouts stay in theirs, resumes keep settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from provenance_setup import TRAINER, turn

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.training import TrajectoryStore, build_flow_grpo_rows, collect
from flowlearn.training.rollouts import Rollouts
from flowlearn.training.trajectories import DROPPED


class CountingGraph:
    """A graph of one planner call that answers at once, and counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def invoke(self, inputs: dict[str, Any], context: Any = None) -> dict[str, Any]:
        self.runs += 1
        call = turn("set when stored", 1, temperature=0.7)
        return {"question": inputs["question"], "answer": "x", "transitions": [call]}


def judge(answer: str, case: Case) -> Score:
    if case.id == "bad":
        raise TimeoutError("judge timed out")
    return Score(1.0 if answer == case.reference else 0.0, "exact match")


CASES = [Case("a", "A?", "x"), Case("bad", "B?", "x")]


def test_rollouts_carry_the_run_id_and_reward_errors_come_back_marked(tmp_path: Path) -> None:
    graph = CountingGraph()
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    source = Rollouts(
        lambda policy: graph, judge, CASES, store=store, concurrency=1, reward_errors="drop"
    )
    source.run_id = "r1"
    out = source.run(None, CASES, group_size=2, context=None, step=3, rank=0)  # type: ignore[arg-type]
    ids = ["step3:a/0@r1", "step3:a/1@r1", "step3:bad/0@r1", "step3:bad/1@r1"]
    assert [t.trajectory_id for t in out] == ids
    assert all(t.metadata["run_id"] == "r1" for t in store.load())
    assert [bool(t.metadata.get(DROPPED)) for t in out] == [False, False, True, True]
    batch = build_flow_grpo_rows(out, sampling=TRAINER)
    assert (batch.stats["trajectories_dropped"], batch.stats["rows"]) == (2, 2)


class FailingServerGraph(CountingGraph):
    """A graph whose second question's run a model call ended (`engine_error`), its first turn
    already taken: the outcome says how the server fared, not how the policy chose."""

    def invoke(self, inputs: dict[str, Any], context: Any = None) -> dict[str, Any]:
        state = super().invoke(inputs, context)
        if inputs["question"] == "B?":
            state["termination"] = "engine_error"
        return state


def test_a_rollout_a_model_call_ended_is_left_out_of_training(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    cases = [Case("a", "A?", "x"), Case("b", "B?", "x")]
    source = Rollouts(lambda policy: FailingServerGraph(), judge, cases, store=store, concurrency=1)
    out = source.run(None, cases, group_size=2, context=None, step=0, rank=0)  # type: ignore[arg-type]
    assert [t.metadata.get(DROPPED) for t in out] == [
        None,
        None,
        "a model call failed (termination engine_error)",
        "a model call failed (termination engine_error)",
    ]
    batch = build_flow_grpo_rows(out, sampling=TRAINER)  # its first turn has tokens, yet
    assert (batch.stats["trajectories_dropped"], batch.stats["rows"]) == (2, 2)


def test_stored_rollouts_are_reused_only_by_their_own_run(tmp_path: Path) -> None:
    graph = CountingGraph()
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    collect(graph, CASES[:1], judge, group_size=2, store=store, progress=False, run_id="r1")
    assert graph.runs == 2
    again = collect(graph, CASES[:1], judge, group_size=2, store=store, progress=False, run_id="r1")
    assert graph.runs == 2 and len(again) == 2  # the same run: reused
    other = collect(graph, CASES[:1], judge, group_size=2, store=store, progress=False, run_id="r2")
    assert graph.runs == 4 and {t.metadata["run_id"] for t in other} == {"r2"}  # never reused


def flow_config(out: Path, **overrides: Any) -> Any:
    from flowlearn.training.config import FlowGRPOConfig

    values: dict[str, Any] = dict(benchmark="gameof24", output_dir=str(out), report_to="none")
    return FlowGRPOConfig(**{**values, **overrides})


def test_a_run_id_is_made_once_and_kept_on_resume(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.training.run import RUN_FILE, check_run, open_run

    out = tmp_path / "out"
    first = open_run(flow_config(out), resuming=False)
    record = json.loads((out / RUN_FILE).read_text())
    assert record["run_id"] == first and record["rollout_settings"]["temperature"] == 0.7
    (out / "rollouts.jsonl").write_text('{"trajectory_id": "step0:a/0@' + first + '"}\n')
    assert check_run(flow_config(out), resuming=True) == first
    assert open_run(flow_config(out, learning_rate=1e-3), resuming=True) == first  # update-only
    assert open_run(flow_config(tmp_path / "other"), resuming=False) != first


def test_a_fresh_run_beside_stored_rollouts_is_refused_and_nothing_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("trl")
    from flowlearn.cli import main
    from flowlearn.training.run import check_run, open_run

    out = tmp_path / "out"
    run_id = open_run(flow_config(out), resuming=False)
    (out / "rollouts.rank1.jsonl").write_text('{"trajectory_id": "x"}\n')
    with pytest.raises(ValueError, match=f"rollouts of run {run_id}.*pass --resume"):
        check_run(flow_config(out), resuming=False)
    assert main(["train", "--benchmark", "gameof24", "--output-dir", str(out)]) == 2
    error = capsys.readouterr().err
    assert "pass --resume to continue that run, or choose another output_dir" in error
    assert (out / "rollouts.rank1.jsonl").read_text() == '{"trajectory_id": "x"}\n'
    assert check_run(flow_config(tmp_path / "empty"), resuming=False) is None


def test_resume_with_other_rollout_settings_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.training.run import check_run, open_run, resume_point

    out = tmp_path / "out"
    run_id = open_run(flow_config(out, max_turns=2), resuming=False)
    # stopped before its first checkpoint: --resume starts it again, same id and rollouts
    assert resume_point(flow_config(out, resume=True)) is None
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resume_point(flow_config(tmp_path / "never", resume=True))
    (out / "rollouts.jsonl").write_text('{"trajectory_id": "x"}\n')
    with pytest.raises(ValueError, match=r"max_turns 2, now 3; temperature 0\.7, now 0\.5"):
        check_run(flow_config(out, temperature=0.5), resuming=True)
    assert check_run(flow_config(out, max_turns=2), resuming=True) == run_id
    with pytest.raises(ValueError, match="query_analysis None, now True"):
        check_run(flow_config(out, max_turns=2, query_analysis=True), resuming=True)
    with pytest.raises(ValueError, match="prompts None, now 'agentflow'"):
        check_run(flow_config(out, max_turns=2, prompts="agentflow"), resuming=True)
    record = json.loads((out / "run.json").read_text())
    del record["rollout_settings"]["query_analysis"]  # a run recorded before the setting
    (out / "run.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="query_analysis True, now None"):  # it was always on
        check_run(flow_config(out, max_turns=2), resuming=True)


def test_max_completion_length_is_the_planners_budget() -> None:
    pytest.importorskip("trl")
    from flowlearn.graphs import Context
    from flowlearn.training.config import check_settings

    args = flow_config(Path("unused"), max_completion_length=16)
    with pytest.raises(ValueError, match="max_completion_length 16 differs from the planner's"):
        check_settings(
            args, Context(planner_max_new_tokens=12, planner_temperature=0.7), 99, offline=False
        )
    check_settings(
        args, Context(planner_max_new_tokens=16, planner_temperature=0.7), 99, offline=False
    )
    check_settings(
        args, Context(planner_max_new_tokens=12, planner_temperature=0.7), 99, offline=True
    )  # no rollouts
