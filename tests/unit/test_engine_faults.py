"""Engine faults: transient errors are retried by LangGraph, others are recorded; runs go on."""

from __future__ import annotations

import runpy
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context
from flowlearn.graphs import build_agentflow as _build_agentflow
from flowlearn.nodes.retry import ENGINE_RETRY, is_transient
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.training import TrajectoryStore, collect

EXAMPLES = Path(__file__).parents[2] / "examples"

# these tests script the engine by the smollm2 preset's prompt wording
build_agentflow = partial(_build_agentflow, prompts=SMOLLM2_PROMPTS)


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return "Paris"


AGENTFLOW_OPENINGS = {
    "Analyze": "Task: Analyze",
    "Call the tool": "Task: Generate the arguments",
    "Judge whether": "Task: Evaluate if",
    "Answer": "Task: Generate a concise final answer",
}
"""Each role's opening in the smollm2 preset's prompts, and in AgentFlow's."""


def opens(prompt: str, role: str) -> bool:
    return prompt.startswith((role, AGENTFLOW_OPENINGS[role]))


class Flaky:
    """Fail the first `failures` calls of the prompts opening as `prefix`, then answer."""

    def __init__(self, prefix: str, failures: int, error: Exception) -> None:
        self.prefix, self.failures, self.error, self.calls = prefix, failures, error, 0

    def __call__(self, messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        prompt = str(messages[-1].content)
        if opens(prompt, self.prefix) and self.calls < self.failures:
            self.calls += 1
            raise self.error
        if tools:
            return AIMessage("", tool_calls=[{"name": "lookup", "args": {"query": "x"}, "id": "1"}])
        if opens(prompt, "Judge whether"):
            return "Conclusion: STOP"
        return "<answer>Paris</answer>" if opens(prompt, "Answer") else "Analysis."


def flow(respond: Flaky) -> Any:
    fast = ENGINE_RETRY._replace(initial_interval=0.01, jitter=False)
    return build_agentflow(
        ScriptedPolicy([plan("lookup")]),
        FakeChatModel(respond=respond),
        [lookup],
        retry_policy=fast,
    )


@pytest.mark.parametrize("prefix", ["Analyze", "Call the tool", "Judge whether", "Answer"])
def test_transient_errors_are_retried_by_the_node(prefix: str) -> None:
    respond = Flaky(prefix, failures=2, error=TimeoutError("engine timed out"))
    state = flow(respond).invoke(
        {"question": "Capital of France?"}, context=Context(max_turns=1, query_analysis=True)
    )
    assert respond.calls == 2
    assert state["answer"] == "Paris"
    assert all(t["parse_status"] != "error" for t in state["transitions"])


@pytest.mark.parametrize(
    ("prefix", "node"),
    [
        ("Analyze", "query_analysis"),
        ("Call the tool", None),
        ("Judge whether", "verifier"),
        ("Answer", "generator"),
    ],
)
def test_exhausted_retries_are_recorded_and_the_run_goes_on(prefix: str, node: str | None) -> None:
    respond = Flaky(prefix, failures=10, error=ConnectionError("engine down"))
    state = flow(respond).invoke(
        {"question": "q"}, context=Context(max_turns=1, query_analysis=True)
    )
    assert respond.calls == ENGINE_RETRY.max_attempts
    expected = "the engine failed (transient; retries exhausted): ConnectionError: engine down"
    if node is None:
        action = next(r for r in state["memory"] if r["kind"] == "action")
        assert expected in action["error"]
    else:
        failed = [t for t in state["transitions"] if t["node"] == node]
        assert failed[0]["parse_status"] == "error" and expected in failed[0]["output"]
    assert "final_text" in state


@pytest.mark.slow
@pytest.mark.parametrize("failures", [2, 10])
def test_a_graph_composed_by_hand_survives_engine_faults_like_the_default(failures: int) -> None:
    """The retries live in the nodes, so a hand-built graph without a graph-level RetryPolicy
    (examples/planner_without_verifier.py) behaves as the default graph does."""
    build_graph = runpy.run_path(str(EXAMPLES / "planner_without_verifier.py"))["build_graph"]
    results = {}
    for name in ("default", "by hand"):
        respond = Flaky("Answer", failures=failures, error=ConnectionError("engine down"))
        if name == "default":
            graph = flow(respond)
        else:
            graph = build_graph(
                ScriptedPolicy([plan("lookup")]), FakeChatModel(respond=respond), [lookup]
            )
        state = graph.invoke({"question": "q"}, context=Context(max_turns=1))
        results[name] = (respond.calls, state["transitions"][-1]["parse_status"], state["answer"])
    assert results["by hand"] == results["default"]
    if failures == 2:
        assert results["default"] == (2, "ok", "Paris")
    else:
        assert results["default"][:2] == (ENGINE_RETRY.max_attempts, "error")


def test_without_a_retry_policy_a_transient_error_is_recorded_at_once() -> None:
    respond = Flaky("Answer", failures=10, error=TimeoutError("slow"))
    graph = build_agentflow(
        ScriptedPolicy([plan("lookup")]),
        FakeChatModel(respond=respond),
        [lookup],
        retry_policy=None,
    )
    state = graph.invoke({"question": "q"}, context=Context(max_turns=1))
    assert respond.calls == 1
    assert "retries exhausted" in state["transitions"][-1]["output"]


@pytest.mark.parametrize(
    ("prefix", "node"),
    [
        ("Analyze", "query_analysis"),
        ("Call the tool", None),
        ("Judge whether", "verifier"),
        ("Answer", "generator"),
    ],
)
def test_other_engine_errors_are_recorded_and_the_run_goes_on(
    prefix: str, node: str | None
) -> None:
    respond = Flaky(prefix, failures=10, error=ValueError("malformed request"))
    state = flow(respond).invoke(
        {"question": "Capital of France?"}, context=Context(max_turns=1, query_analysis=True)
    )
    assert respond.calls == 1  # not retried
    if node is None:  # the executor records it as the step's error
        action = next(r for r in state["memory"] if r["kind"] == "action")
        assert "the engine failed: ValueError: malformed request" in action["error"]
    else:
        failed = [t for t in state["transitions"] if t["node"] == node]
        assert failed[0]["parse_status"] == "error"
        assert "malformed request" in failed[0]["output"]
    assert "final_text" in state  # the run reached its end


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (type("RateLimitError", (Exception,), {})(), True),
        (type("HTTPStatusError", (Exception,), {"status_code": 503})(), True),
        (ValueError("bad"), False),
        (KeyError("x"), False),
    ],
)
def test_what_counts_as_transient(error: Exception, transient: bool) -> None:
    assert is_transient(error) is transient


@tool
def hangs(query: str) -> str:
    """Never come back (in time)."""
    time.sleep(30)
    return "too late"


@tool
def floods(query: str) -> str:
    """Return 10 MB of text."""
    return "x" * 10_000_000


@pytest.mark.parametrize(
    ("tool_", "expected"), [(hangs, "did not finish within 0.5 s"), (floods, "[... truncated")]
)
def test_a_hanging_or_flooding_tool_does_not_stop_the_run(tool_: Any, expected: str) -> None:
    def respond(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        if tools:
            call = {"name": tool_.name, "args": {"query": "x"}, "id": "1"}
            return AIMessage("", tool_calls=[call])
        prompt = str(messages[-1].content)
        return "Conclusion: STOP" if prompt.startswith("Judge") else "<answer>none</answer>"

    graph = build_agentflow(
        ScriptedPolicy([plan(tool_.name)]), FakeChatModel(respond=respond), [tool_]
    )
    state = graph.invoke(
        {"question": "q"}, context=Context(max_turns=1, tool_timeout_s=0.5, max_result_chars=1000)
    )
    action = next(r for r in state["memory"] if r["kind"] == "action")
    text = action["error"] or action["result"]
    assert expected in text and len(text) < 1200
    assert state["answer"] == "none"


@pytest.mark.parametrize("seconds", [0, -1])
def test_a_tool_timeout_must_be_positive(seconds: float) -> None:
    with pytest.raises(ValueError, match="tool_timeout_s must be > 0"):
        Context(tool_timeout_s=seconds)


@tool
def raises(query: str) -> str:
    """Fail every time."""
    raise RuntimeError("the backend is down")


def test_no_fault_stops_a_collection(tmp_path: Path) -> None:
    """Hanging, flooding and raising tools, a failing engine, a failing judge and a run over
    its time budget, all in one collection: every rollout is stored, each fault recorded."""
    faults = {"hang": "hangs", "flood": "floods", "raise": "raises", "engine": "lookup"}

    def decide(messages: list[dict[str, str]]) -> str:
        text = messages[-1]["content"]
        if "Question: slow" in text:
            time.sleep(0.2)
        return plan(next((t for k, t in faults.items() if f"Question: {k}" in text), "lookup"))

    def respond(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        everything = " ".join(str(m.content) for m in messages)
        if "Question: engine" in everything:
            raise ValueError("malformed request")
        if tools:
            return AIMessage(
                "", tool_calls=[{"name": tools[0]["name"], "args": {"query": "x"}, "id": "1"}]
            )
        prompt = str(messages[-1].content)
        if prompt.startswith("Judge whether"):
            return "Conclusion: CONTINUE" if "Question: slow" in everything else "Conclusion: STOP"
        return "<answer>Paris</answer>"

    def judge(answer: str, case: Case) -> Score:
        if case.id == "judge":
            raise TimeoutError("the judge timed out")
        return Score(float(answer == "Paris"), "exact")

    tools = [hangs, floods, raises, lookup]
    graph = build_agentflow(ScriptedPolicy([decide]), FakeChatModel(respond=respond), tools)
    names = ["hang", "flood", "raise", "engine", "slow", "judge"]
    cases = [Case(n, n, "Paris") for n in names]
    store = TrajectoryStore(tmp_path / "t.jsonl")
    context = Context(max_turns=30, max_seconds=0.6, tool_timeout_s=0.3, max_result_chars=1000)
    got = {
        t.group_id: t
        for t in collect(
            graph, cases, judge, group_size=1, store=store, context=context, progress=False
        )
    }
    assert sorted(got) == sorted(names) and len(store.load()) == len(names)

    def action_text(case: str) -> str:
        action = next(r for r in got[case].memory if r["kind"] == "action")
        return str(action["error"] or action["result"])

    assert "did not finish within 0.3 s" in action_text("hang")
    assert "[... truncated" in action_text("flood") and len(action_text("flood")) < 1200
    assert "the backend is down" in action_text("raise")
    assert "malformed request" in action_text("engine")
    assert got["slow"].termination == "max_seconds" and got["slow"].turns >= 1
    assert got["judge"].reward == 0 and "the judge timed out" in (got["judge"].reward_error or "")
    assert all(got[n].final_text for n in names)
