from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import exact_match
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes import token_faithful
from flowlearn.training import (
    Trajectory,
    TrajectoryStore,
    collect,
    export_parquet,
    format_penalty,
    from_dataset,
    load_trajectories,
    read_parquet,
    to_dataset,
)


@tool
def lookup(query: str) -> str:
    """Look up a fact."""
    return "paris"


def engine_for(answer: str) -> FakeChatModel:
    def respond(messages: object, tools: list[dict[str, object]]) -> object:
        if tools:
            return AIMessage(
                content="", tool_calls=[{"name": "lookup", "args": {"query": "q"}, "id": "1"}]
            )
        return f"Conclusion: STOP\n<answer>{answer}</answer>"

    return FakeChatModel(respond=respond)


def scorer(answer: str, case: Case):  # type: ignore[no-untyped-def]
    return exact_match(answer, case.reference)


CASES = [Case("q1", "Capital of France?", "paris"), Case("q2", "Capital of Spain?", "madrid")]


def test_collect_runs_g_rollouts_per_question_and_rewards_them(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "t.jsonl")
    graph = build_agentflow(ScriptedPolicy(["bad", plan("lookup")]), engine_for("paris"), [lookup])
    out = collect(
        graph,
        CASES,
        scorer,
        group_size=3,
        store=store,
        progress=False,
        context=Context(max_turns=3, seed=10),
        extra_rewards={"format_penalty": format_penalty(0.5)},
    )
    assert [t.trajectory_id for t in out] == ["q1/0", "q1/1", "q1/2", "q2/0", "q2/1", "q2/2"]
    assert [t.group_id for t in out] == ["q1"] * 3 + ["q2"] * 3
    assert [t.reward for t in out] == [1.0] * 3 + [0.0] * 3
    assert {t.context["seed"] for t in out if t.group_id == "q1"} == {10, 11, 12}
    for trajectory in out:
        planner = [t for t in trajectory.transitions if t["node"] == "planner"]
        assert trajectory.reward_terms["format_penalty"] == pytest.approx(
            -0.5 * sum(t["parse_status"] != "ok" for t in planner) / len(planner)
        )
        assert all(token_faithful(t) for t in planner)
        assert trajectory.memory and trajectory.turns >= 1
    assert store.ids() == {t.trajectory_id for t in out}


def test_format_penalty_counts_the_calls_of_the_nodes_it_names() -> None:
    def call(node: str, status: str) -> dict[str, object]:
        return {"node": node, "turn": 0, "parse_status": status}

    calls = [call("planner", "ok"), call("verifier", "unclear"), call("verifier", "ok")]
    trajectory = Trajectory("q/0", "q", "?", "a", "a", "a", 1.0, transitions=calls)  # type: ignore[arg-type]
    assert format_penalty(0.5)(trajectory) == 0.0  # the planner's calls only, by default
    assert format_penalty(0.5, ["verifier"])(trajectory) == pytest.approx(-0.25)
    assert format_penalty(0.6, ["planner", "verifier"])(trajectory) == pytest.approx(-0.2)
    assert format_penalty(0.5, ["generator"])(trajectory) == 0.0  # no calls, no penalty


def test_collect_resumes_only_missing_rollouts(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "t.jsonl")
    policy = ScriptedPolicy([plan("lookup")])
    graph = build_agentflow(policy, engine_for("paris"), [lookup])
    collect(graph, CASES[:1], scorer, group_size=2, store=store, progress=False)
    calls = len(policy.calls)
    out = collect(graph, CASES, scorer, group_size=2, store=store, progress=False)
    assert len(out) == 4 and len(store.load()) == 4
    assert len(policy.calls) == calls * 2  # only q2's two rollouts ran


def test_failing_scorer_marks_the_trajectory(tmp_path: Path) -> None:
    def broken(answer: str, case: Case):  # type: ignore[no-untyped-def]
        raise TimeoutError("judge down")

    graph = build_agentflow(ScriptedPolicy([plan("lookup")]), engine_for("x"), [lookup])
    (trajectory,) = collect(graph, CASES[:1], broken, group_size=1, progress=False)
    assert trajectory.reward == 0.0 and trajectory.reward_error == "TimeoutError: judge down"

    store = TrajectoryStore(tmp_path / "dropped.jsonl")
    kept = collect(
        graph, CASES[:1], broken, group_size=2, store=store, progress=False, reward_errors="drop"
    )
    assert kept == [] and [t.reward_error for t in store.load()] == ["TimeoutError: judge down"] * 2
    with pytest.raises(ValueError, match="reward_errors"):
        collect(graph, CASES[:1], broken, group_size=1, progress=False, reward_errors="skip")


def make_trajectories() -> list[Trajectory]:
    graph = build_agentflow(ScriptedPolicy([plan("lookup")]), engine_for("paris"), [lookup])
    return collect(graph, CASES, scorer, group_size=2, progress=False)


def test_parquet_and_dataset_round_trips_are_lossless(tmp_path: Path) -> None:
    trajectories = make_trajectories()
    path = export_parquet(trajectories, tmp_path / "t.parquet")
    back = read_parquet(path)
    assert [t.to_dict() for t in back] == [t.to_dict() for t in trajectories]
    turn = next(i for i, t in enumerate(trajectories[0].transitions) if t["node"] == "planner")
    assert (
        load_trajectories(path)[0].transitions[turn]["logprobs"]
        == trajectories[0].transitions[turn]["logprobs"]
    )
    dataset = to_dataset(trajectories)
    assert len(dataset) == 4
    assert [t.to_dict() for t in from_dataset(dataset)] == [t.to_dict() for t in trajectories]


def test_store_skips_torn_line_and_appends_after_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trajectories = make_trajectories()
    store = TrajectoryStore(tmp_path / "t.jsonl")
    store.append(trajectories[0])
    with store.path.open("a") as handle:
        handle.write(trajectories[1].to_json()[:100])  # a crash mid-write
    assert [t.trajectory_id for t in store.load()] == ["q1/0"]
    assert "torn" in caplog.text
    store.append(trajectories[2])
    assert [t.trajectory_id for t in store.load()] == ["q1/0", "q2/0"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("id,question\n1,what\n", "has no readable trajectory"),
        ('{"trajectory_id": "x"}\n', "t.jsonl:1 is not a flowlearn trajectory"),
        ("[1, 2]\n", "t.jsonl:1 is not a flowlearn trajectory"),
    ],
)
def test_a_corrupt_trajectory_file_is_a_clear_error(
    tmp_path: Path, content: str, message: str
) -> None:
    store = TrajectoryStore(tmp_path / "t.jsonl")
    store.path.write_text(content)
    with pytest.raises(ValueError, match=message):
        store.load()
    with pytest.raises(ValueError, match=message):  # before any rollout runs
        collect(
            lambda: None,
            [Case("q", "q?", "a")],
            lambda a, c: exact_match(a, "a"),
            group_size=1,
            store=store,
        )
    assert store.path.read_text() == content  # nothing written over it


def test_newer_schema_is_refused() -> None:
    data = make_trajectories()[0].to_dict() | {"schema_version": 99}
    with pytest.raises(ValueError, match="upgrade flowlearn"):
        Trajectory.from_dict(data)


@pytest.mark.slow
def test_killed_collection_resumes_with_nothing_lost_or_duplicated(tmp_path: Path) -> None:
    store = tmp_path / "t.jsonl"
    job = [sys.executable, str(Path(__file__).parents[1] / "collect_job.py"), str(store)]
    child = subprocess.Popen([*job, "0.15"], start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and len(TrajectoryStore(store).load()) < 5:
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert 5 <= len(TrajectoryStore(store).load()) < 20
    subprocess.run([*job, "0"], check=True, timeout=120)
    ids = [
        json.loads(line)["trajectory_id"]
        for line in store.read_text().splitlines()
        if line.startswith("{") and line.endswith("}")
    ]
    assert sorted(ids) == sorted(f"q{i}/{k}" for i in range(5) for k in range(4))


def test_collect_cli_with_tiny_model(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flowlearn.cli import main
    from flowlearn.training import build_flow_grpo_rows

    out = tmp_path / "rollouts.jsonl"
    argv = [
        "collect",
        "--benchmark",
        "gameof24",
        "--limit",
        "2",
        "--group-size",
        "2",
        "--planner",
        str(tiny_model_dir),
        "--max-turns",
        "1",
        "--max-new-tokens",
        "8",
        "--engine-max-new-tokens",
        "8",
        "--seed",
        "0",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert "4 trajectories" in capsys.readouterr().out
    trajectories = load_trajectories(out)
    assert sorted(t.trajectory_id for t in trajectories) == ["0/0", "0/1", "1/0", "1/1"]
    batch = build_flow_grpo_rows(trajectories)
    assert batch.stats["rows"] == 4 and batch.stats["groups"] == 2
    assert main(argv) == 0  # resumes: nothing left to do, nothing duplicated
    assert len(TrajectoryStore(out).load()) == 4


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--benchmark", "gameof24", "--group-size", "0", "--out", "x.jsonl"], "--group-size"),
        (["--benchmark", "gameof24", "--out", "x.parquet"], "must be a .jsonl file"),
        (["--out", "x.jsonl"], "exactly one of --benchmark"),
    ],
)
def test_collect_cli_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from flowlearn.cli import main

    assert main(["collect", *argv]) == 2
    assert message in capsys.readouterr().err
