from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import Context
from flowlearn.graphs import build_agentflow as _build_agentflow
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS

SNAPSHOTS = Path(__file__).parent.parent / "snapshots"

# these tests script the engine by the smollm2 preset's prompt wording
build_agentflow = partial(_build_agentflow, prompts=SMOLLM2_PROMPTS)


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


@tool
def flaky(query: str) -> str:
    """Fails every time."""
    raise ConnectionError("service unavailable")


def verifier_says(*verdicts: str, args: dict[str, Any] | None = None) -> FakeChatModel:
    """An engine that fills tool args, answers verifications in turn and tags a final answer."""
    calls = {"verify": 0}

    def respond(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> Any:
        from langchain_core.messages import AIMessage

        prompt = str(messages[-1].content)
        if tools:
            return AIMessage(
                content="",
                tool_calls=[
                    {"name": tools[0]["name"], "args": args or {"a": 17, "b": 23}, "id": "1"}
                ],
            )
        if prompt.startswith("Judge whether"):
            verdict = verdicts[min(calls["verify"], len(verdicts) - 1)]
            calls["verify"] += 1
            return f"Analysis done.\nConclusion: {verdict}"
        if prompt.startswith("Answer the question"):
            return "The product is 391. <answer>391</answer>"
        return "The goal is a product of two integers."

    return FakeChatModel(respond=respond)


def test_run_stops_on_verifier_stop() -> None:
    graph = build_agentflow(ScriptedPolicy([plan("multiply")]), verifier_says("STOP"), [multiply])
    nodes = [
        next(iter(chunk)) for chunk in graph.stream({"question": "17*23?"}, stream_mode="updates")
    ]
    assert nodes == ["planner", "executor", "verifier", "generator"]
    state = graph.invoke({"question": "17*23?"})
    assert state["answer"] == "391"
    assert state["termination"] == "verifier_stop"
    assert state["turn"] == 1
    assert [r["kind"] for r in state["memory"]] == ["action", "verification"]
    assert state["memory"][0]["result"] == "391"
    assert [t["node"] for t in state["transitions"]] == [  # no query analysis by default
        "planner",
        "executor",
        "verifier",
        "generator",
    ]


def test_run_stops_at_max_turns() -> None:
    graph = build_agentflow(
        ScriptedPolicy([plan("multiply")]), verifier_says("CONTINUE"), [multiply]
    )
    state = graph.invoke({"question": "q"}, context=Context(max_turns=3))
    assert state["termination"] == "max_turns"
    assert state["turn"] == 3
    assert sum(r["kind"] == "action" for r in state["memory"]) == 3
    assert state["answer"] == "391"


def test_run_stops_at_max_seconds() -> None:
    def slow(messages: Any) -> str:
        time.sleep(0.15)
        return plan("multiply")

    graph = build_agentflow(ScriptedPolicy([slow]), verifier_says("CONTINUE"), [multiply])
    state = graph.invoke({"question": "q"}, context=Context(max_turns=50, max_seconds=0.3))
    assert state["termination"] == "max_seconds"
    assert 1 <= state["turn"] < 50
    assert state["final_text"]


def test_malformed_planner_outputs_count_as_steps_and_never_raise() -> None:
    replies = ["", "```json\n{broken", "Tool Name: nowhere\nSub-Goal: x", "\x00\ufffd" * 50]
    graph = build_agentflow(ScriptedPolicy(replies), verifier_says("CONTINUE"), [multiply])
    state = graph.invoke({"question": "q"}, context=Context(max_turns=4))
    assert state["termination"] == "max_turns"
    assert state["turn"] == 4
    assert [r["kind"] for r in state["memory"]] == ["format_error"] * 4
    statuses = [t["parse_status"] for t in state["transitions"] if t["node"] == "planner"]
    assert statuses == ["format_error", "format_error", "unknown_tool", "format_error"]


def test_tool_that_raises_is_recorded_and_flow_finishes() -> None:
    engine = verifier_says("STOP", args={"query": "x"})
    graph = build_agentflow(ScriptedPolicy([plan("flaky")]), engine, [flaky])
    state = graph.invoke({"question": "q"})
    assert state["memory"][0]["error"] == "ConnectionError: service unavailable"
    assert state["answer"] == "391"


def test_build_rejects_bad_tool_sets() -> None:
    with pytest.raises(ValueError, match="at least one tool"):
        build_agentflow(ScriptedPolicy(["x"]), FakeChatModel(), [])
    with pytest.raises(ValueError, match="more than once"):
        build_agentflow(ScriptedPolicy(["x"]), FakeChatModel(), [multiply, multiply])
    with pytest.raises(TypeError, match="Policy"):
        build_agentflow(object(), FakeChatModel(), [multiply])  # type: ignore[arg-type]


def test_chat_model_can_plan_for_inference_only() -> None:
    planner = FakeChatModel(text=plan("multiply"))
    graph = build_agentflow(planner, verifier_says("STOP"), [multiply])
    state = graph.invoke({"question": "q"})
    turn = next(t for t in state["transitions"] if t["node"] == "planner")
    assert turn["completion_ids"] is None and turn["logprobs"] is None
    assert state["answer"] == "391"


def test_mermaid_snapshot() -> None:
    graph = build_agentflow(ScriptedPolicy(["x"]), FakeChatModel(), [multiply])
    drawn = graph.get_graph().draw_mermaid()
    snapshot = SNAPSHOTS / "agentflow.mmd"
    assert drawn == snapshot.read_text(), "graph shape changed; review and update the snapshot"


def test_sqlite_checkpoint_resumes_thread(tmp_path: Path) -> None:
    db = str(tmp_path / "runs.sqlite")
    config = {"configurable": {"thread_id": "t1"}}
    policy = ScriptedPolicy([plan("multiply")])
    with SqliteSaver.from_conn_string(db) as saver:
        graph = build_agentflow(policy, verifier_says("CONTINUE"), [multiply], checkpointer=saver)
        graph.invoke(
            {"question": "17*23?"},
            config,
            context=Context(max_turns=5),
            interrupt_after=["verifier"],
        )
        snapshot = graph.get_state(config)
        assert snapshot.next == ("planner",)
        assert snapshot.values["turn"] == 1
    with SqliteSaver.from_conn_string(db) as saver:  # a new process would do just this
        graph = build_agentflow(policy, verifier_says("STOP"), [multiply], checkpointer=saver)
        state = graph.invoke(None, config, context=Context(max_turns=5))
    assert state["turn"] == 2
    assert state["termination"] == "verifier_stop"
    assert len(policy.calls) == 2  # the first turn was not repeated
    assert state["memory"][0]["result"] == "391"
