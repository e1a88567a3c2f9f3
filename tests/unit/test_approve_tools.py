"""`approve_tools` resumes: the accepted forms run or reject; anything else asks again, unrun."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.tools import BaseTool, StructuredTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.tool_review import argument_problems, resume_problem


def counting_multiply(calls: list[tuple[int, int]]) -> BaseTool:
    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        calls.append((a, b))
        return a * b

    return multiply


def paused_flow(calls: list[tuple[int, int]], thread: str) -> tuple[Any, dict[str, Any]]:
    engine = FakeChatModel(
        default_args={"a": 17, "b": 23}, text="Conclusion: STOP\n<answer>391</answer>"
    )
    graph = build_agentflow(
        ScriptedPolicy([plan("multiply")]),
        engine,
        [counting_multiply(calls)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": thread}}
    paused = graph.invoke({"question": "17*23?"}, config, context=Context(approve_tools=True))
    (pending,) = paused["__interrupt__"]
    assert pending.value["schema"] == {
        "a": {"title": "A", "type": "integer"},
        "b": {"title": "B", "type": "integer"},
    }
    assert "error" not in pending.value
    return graph, config


def resume(graph: Any, config: dict[str, Any], value: object) -> dict[str, Any]:
    return graph.invoke(Command(resume=value), config, context=Context(approve_tools=True))


@pytest.mark.parametrize(
    ("decision", "ran", "error"),
    [
        ({"approve": True}, [(17, 23)], None),
        ({"approve": False}, [], "the tool call was rejected by the reviewer"),
        ({"arguments": {"a": 2, "b": 3}}, [(2, 3)], None),
    ],
)
def test_documented_dict_forms_run_or_reject(
    decision: object, ran: list[tuple[int, int]], error: str | None
) -> None:
    calls: list[tuple[int, int]] = []
    graph, config = paused_flow(calls, f"ok-{decision}")
    state = resume(graph, config, decision)
    assert "__interrupt__" not in state
    assert calls == ran and state["memory"][0]["error"] == error


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ({"a": 2, "b": 3, "c": 4}, "unknown key 'c'"),
        ({"a": 2}, "'b': Field required"),
        ({"a": "2", "b": 3}, "'a': Input should be a valid integer, got '2'"),
        ({"a": 2.5, "b": 3}, "'a': Input should be a valid integer"),
        ({"a": True, "b": 3}, "'a': Input should be a valid integer, got True"),
    ],
)
def test_an_edit_that_breaks_the_schema_asks_again_and_never_runs(
    edit: dict[str, Any], named: str
) -> None:
    calls: list[tuple[int, int]] = []
    graph, config = paused_flow(calls, f"bad-{edit}")
    state = resume(graph, config, {"arguments": edit})
    (pending,) = state["__interrupt__"]
    assert named in pending.value["error"]
    assert "do not fit multiply's schema" in pending.value["error"]
    assert '{"arguments": {...}}' in pending.value["error"]
    assert pending.value["arguments"] == {"a": 17, "b": 23} and calls == []
    assert state.get("memory", []) == []
    # The same thread resumes with a corrected value: only that one runs.
    state = resume(graph, config, {"arguments": {"a": 2, "b": 5}})
    assert "__interrupt__" not in state
    assert calls == [(2, 5)] and state["memory"][0]["result"] == "10"


@pytest.mark.parametrize(
    "value",
    [
        "yes",
        1,
        0,
        [],
        {"approve": "yes"},
        {"approve": 1},
        {"approve": True, "arguments": {"a": 1, "b": 2}},
        {"arguments": "a=1, b=2"},
        {"args": {"a": 1, "b": 2}},
    ],
)
def test_a_malformed_resume_value_names_the_accepted_forms(value: object) -> None:
    calls: list[tuple[int, int]] = []
    graph, config = paused_flow(calls, f"malformed-{value!r}")
    state = resume(graph, config, value)
    (pending,) = state["__interrupt__"]
    assert pending.value["error"].startswith("unrecognised resume value")
    for form in ('True or {"approve": true}', 'False or {"approve": false}', '{"arguments":'):
        assert form in pending.value["error"]
    assert calls == []
    state = resume(graph, config, False)
    assert state["memory"][0]["error"] == "the tool call was rejected by the reviewer"
    assert calls == []


def test_an_edit_to_empty_arguments_runs_with_them_not_the_proposal() -> None:
    @tool
    def greet(name: str = "world") -> str:
        """Greet someone."""
        return f"hello {name}"

    engine = FakeChatModel(
        default_args={"name": "Ada"}, text="Conclusion: STOP\n<answer>hi</answer>"
    )
    graph = build_agentflow(
        ScriptedPolicy([plan("greet")]), engine, [greet], checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "empty-edit"}}
    graph.invoke({"question": "greet"}, config, context=Context(approve_tools=True))
    state = resume(graph, config, {"arguments": {}})
    assert state["memory"][0]["arguments"] == {}
    assert state["memory"][0]["result"] == "hello world"


def test_a_plain_json_schema_tool_is_checked_on_keys_and_types() -> None:
    search = StructuredTool(
        name="search",
        description="Search.",
        args_schema={
            "type": "object",
            "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
            "required": ["query"],
        },
        func=lambda query, k=3: query,
    )
    assert argument_problems(search, {"query": "x", "k": 2}) == []
    assert argument_problems(search, {"query": "x"}) == []
    problems = argument_problems(search, {"k": "2", "extra": 1})
    assert "unknown key 'extra'" in problems
    assert "'query': Field required" in problems
    assert any(p.startswith("'k': Input should be a valid integer") for p in problems)
    assert resume_problem({"arguments": {"query": 3}}, search) is not None
