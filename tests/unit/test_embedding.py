from __future__ import annotations

import asyncio
import importlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import Context, as_tool, build_agentflow

EXAMPLES = Path(__file__).parents[2] / "examples"
sys.path.append(str(EXAMPLES))  # after tests/: never shadowing tests/tiny_model.py


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def flow(**kwargs: object):  # type: ignore[no-untyped-def]
    engine = FakeChatModel(
        default_args={"a": 17, "b": 23}, text="Conclusion: STOP\n<answer>391</answer>"
    )
    return build_agentflow(ScriptedPolicy([plan("multiply")]), engine, [multiply], **kwargs)


def test_flow_as_node_of_a_parent_graph_with_other_keys() -> None:
    module = vars(importlib.import_module("parent_graph"))
    result = module["build_parent"](flow()).invoke({"user_query": "What is 17 * 23?"})
    assert result["solution"] == "391" and result["reply"] == "The answer is 391."
    assert result["agent_memory"][0]["result"] == "391"


def test_flow_as_a_tool_of_a_react_agent() -> None:
    module = vars(importlib.import_module("as_tool"))

    def outer(messages, tools):  # type: ignore[no-untyped-def]
        if messages[-1].type == "tool":
            return f"The flow answered {messages[-1].content}."
        return AIMessage(
            "", tool_calls=[{"name": "agentflow", "id": "c1", "args": {"question": "17*23?"}}]
        )

    agent = module["build_agent"](FakeChatModel(respond=outer), flow())
    result = agent.invoke({"messages": [("user", "compute 17*23")]})
    assert [m.type for m in result["messages"]] == ["human", "ai", "tool", "ai"]
    assert result["messages"][2].content == "391"
    assert result["messages"][-1].content == "The flow answered 391."


def test_async_invoke_and_custom_stream_events() -> None:
    graph = flow()

    async def scenario() -> tuple[dict, list[dict]]:
        events = [
            payload async for payload in graph.astream({"question": "q"}, stream_mode="custom")
        ]
        return await graph.ainvoke({"question": "q"}), events

    state, events = asyncio.run(scenario())
    assert state["answer"] == "391"
    assert [e["event"] for e in events] == ["planner", "tool", "verdict", "answer"]
    assert events[0]["tool"] == "multiply" and events[1]["summary"] == "391"
    assert asyncio.run(as_tool(graph).ainvoke({"question": "q"})) == "391"


@pytest.mark.parametrize(
    ("decision", "result", "error"),
    [
        (True, "391", None),
        ({"arguments": {"a": 2, "b": 3}}, "6", None),
        (False, None, "the tool call was rejected by the reviewer"),
    ],
)
def test_human_approval_interrupt_then_resume(
    decision: object, result: str | None, error: str | None
) -> None:
    graph = flow(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"t-{decision}"}}
    context = Context(approve_tools=True)
    paused = graph.invoke({"question": "17*23?"}, config, context=context)
    (pending,) = paused["__interrupt__"]
    assert pending.value["tool"] == "multiply"
    assert pending.value["arguments"] == {"a": 17, "b": 23}
    state = graph.invoke(Command(resume=decision), config, context=context)
    record = state["memory"][0]
    assert record["result"] == result and record["error"] == error


@pytest.mark.slow
def test_run_killed_mid_way_resumes_from_sqlite_without_repeating_steps(tmp_path: Path) -> None:
    db, log = tmp_path / "threads.sqlite", tmp_path / "calls.log"
    job = [sys.executable, str(Path(__file__).parents[1] / "durable_job.py"), str(db), str(log)]
    child = subprocess.Popen([*job, "1.0"], start_new_session=True)

    def checkpointed_steps() -> int:
        if not db.exists():
            return 0
        with SqliteSaver.from_conn_string(str(db)) as saver:
            found = saver.get_tuple({"configurable": {"thread_id": "job"}})
        return int(found.checkpoint["channel_values"].get("turn", 0)) if found else 0

    deadline = time.time() + 60
    while time.time() < deadline and checkpointed_steps() < 2:
        time.sleep(0.1)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    done = checkpointed_steps()
    assert 2 <= done < 4
    calls_before = len(log.read_text().split())
    subprocess.run([*job, "0"], check=True, timeout=120)
    with SqliteSaver.from_conn_string(str(db)) as saver:
        graph = build_agentflow(
            ScriptedPolicy(["x"]), FakeChatModel(), [multiply], checkpointer=saver
        )
        final = graph.get_state({"configurable": {"thread_id": "job"}}).values
    assert final["turn"] == 4 and final["termination"] == "max_turns"
    assert sum(r["kind"] == "action" for r in final["memory"]) == 4
    calls = len(log.read_text().split())
    # Finished steps were not repeated: the resumed run made only the missing tool calls (plus
    # at most the one that was in flight when the process died).
    assert calls - calls_before <= 4 - done + 1
    assert calls <= 5
