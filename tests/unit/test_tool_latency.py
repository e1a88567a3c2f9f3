"""A step's rollouts wait on their tool calls at once, never one after another."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("tavily")

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score, exact_match
from flowlearn.graphs import Context
from flowlearn.nodes.tools import web_search_tool
from flowlearn.training.rollouts import Rollouts, agentflow_factory

sys.path.append(str(Path(__file__).parents[2] / "bench"))  # after tests/: never shadowing it
from search_stand_in import search_stand_in

CASE = Case("q", "What is the capital of France?", "paris")


def scorer(answer: str, case: Case) -> Score:
    return exact_match(answer, case.reference)


def test_the_stand_in_answers_as_tavily_does() -> None:
    with search_stand_in(0.0) as server:
        out = web_search_tool(api_key="tvly-test", base_url=server.url, max_results=2).invoke(
            {"query": "capital of France"}
        )
    assert out.startswith("[1] Result 1 for capital of France\nURL: https://")
    assert "[2] Result 2" in out and "[3]" not in out  # max_results reached the server
    assert server.queries == ["capital of France"] and server.peak == 1


def test_a_steps_rollouts_wait_on_their_searches_at_once() -> None:
    """8 rollouts of one step, each planner turn a 0.5 s web search: all 8 are in flight at
    once (the stand-in holds each until they are, for up to 10 s), so none waited for another's
    search, and the step takes about one search, not 8."""
    engine = FakeChatModel(default_args={"query": "capital of France"})
    with search_stand_in(0.5, gather=8, gather_timeout=10.0) as server:
        tools = [web_search_tool(api_key="tvly-test", base_url=server.url)]
        source = Rollouts(agentflow_factory(engine, tools), scorer, [CASE])
        trajectories = source.run(
            ScriptedPolicy([plan("web_search")]),
            [CASE],
            group_size=8,  # the step's rollouts all in flight (rollout_concurrency's default)
            context=Context(max_turns=1),
            step=0,
            rank=0,
        )
    assert len(server.queries) == 8
    assert server.peak == 8, f"only {server.peak} of 8 searches were ever in flight at once"
    assert len(trajectories) == 8
    for trajectory in trajectories:
        (action,) = [r for r in trajectory.memory if r["kind"] == "action"]
        assert action["tool"] == "web_search" and action["error"] is None
        assert action["result"].startswith("[1] Result 1 for capital of France")


@pytest.mark.slow  # about 10 s: TRL's import and the bench's tokenizer
def test_the_async_bench_planner_names_the_search_every_turn(tmp_path: Path) -> None:
    """bench/async_training.py's tiny random planner, its head biased to two one-token plans
    that name web_search, plans a search at every turn: otherwise its rollouts wait on
    nothing."""
    pytest.importorskip("trl")
    import async_training as bench

    from flowlearn.engine.local import HFPolicy

    tok = bench.tokenizer(tmp_path / "tokenizer")
    policy = HFPolicy(bench.planner_model(tok), tok, version="bench@0")
    context = Context(
        max_turns=bench.TURNS,
        planner_temperature=bench.TEMPERATURE,
        planner_max_new_tokens=bench.TOKENS,
        seed=0,
    )
    with search_stand_in(0.0) as server:
        tools = [web_search_tool(api_key="tvly-test", base_url=server.url)]
        source = Rollouts(agentflow_factory(bench.scripted_engine(0), tools), scorer, [CASE])
        trajectories = source.run(policy, [CASE], group_size=8, context=context, step=0, rank=0)
    plans = [t for r in trajectories for t in r.transitions if t["node"] == "planner"]
    assert len(plans) == 8 * bench.TURNS
    assert all(t["parse_status"] == "ok" for t in plans), [t["output"] for t in plans]
    assert {len(t["completion_ids"] or []) for t in plans} == {1}  # a plan a token, then stop
    assert len(server.queries) == 8 * bench.TURNS  # every turn searched
