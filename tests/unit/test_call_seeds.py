"""A seeded run gives each planner call a seed of its own, reproducibly."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.engine.sampling import Sampling
from flowlearn.graphs import Context, build_agentflow


@tool
def lookup(query: str) -> str:
    """Look up a fact."""
    return "paris"


def planner_seeds(question: str, seed: int | None) -> list[Any]:
    engine = FakeChatModel(  # calls lookup; never stops the loop
        default_args={"query": "q"}, text="Conclusion: CONTINUE\n<answer>paris</answer>"
    )
    graph = build_agentflow(ScriptedPolicy([plan("lookup")]), engine, [lookup])
    state = graph.invoke({"question": question}, context=Context(max_turns=3, seed=seed))
    return [t["sampling"]["seed"] for t in state["transitions"] if t["node"] == "planner"]


def test_each_turn_and_question_draws_its_own_seed_reproducibly() -> None:
    first = planner_seeds("Capital of France?", 1)
    assert len(first) == 3 and len(set(first)) == 3  # the turns do not share one draw
    assert planner_seeds("Capital of France?", 1) == first  # the same run, the same seeds
    other = planner_seeds("Capital of Spain?", 1)
    assert not set(other) & set(first)  # another question draws afresh under the same seed
    assert not set(planner_seeds("Capital of France?", 2)) & set(first)
    assert all(0 <= s < 2**62 for s in first + other)


def test_an_unseeded_run_stays_unseeded() -> None:
    assert planner_seeds("Capital of France?", None) == [None, None, None]
    sampling = Sampling(temperature=0.5)
    assert sampling.for_call("q", 1) is sampling


def test_the_call_seed_keeps_the_other_settings() -> None:
    sampling = Sampling(temperature=0.3, top_p=0.9, max_new_tokens=7, seed=0)
    call = sampling.for_call("q", 2)
    assert call.seed != 0 and call.seed == sampling.for_call("q", 2).seed
    assert (call.temperature, call.top_p, call.max_new_tokens) == (0.3, 0.9, 7)


def test_the_call_seed_is_the_same_in_every_process_and_apart_from_the_analysis() -> None:
    # blake2b, not Python's salted hash(): a seeded eval draws alike on any machine
    assert Sampling(seed=1).for_call("q", 1).seed == 2920908230457214056
    with pytest.raises(ValueError, match="seed must be a whole number or None, got True"):
        Sampling(seed=True)  # a bool is not a seed, though Python counts it as the int 1
    analysis, turn_one = (Sampling(seed=1).for_call("q", turn).seed for turn in (0, 1))
    assert analysis != turn_one  # a policy-written analysis (turn 0) draws on its own
