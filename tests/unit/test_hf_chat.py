from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool

from fakes import ScriptedPolicy, plan
from flowlearn.engine.chat import HFChatModel, parse_tool_calls, to_chat_dicts
from flowlearn.engine.local import HFPolicy
from flowlearn.graphs import Context, build_agentflow

pytest.importorskip("torch")


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"found: {query}"


@pytest.fixture(scope="module")
def chat(tiny_model_dir: Path) -> HFChatModel:
    return HFChatModel(policy=HFPolicy.from_pretrained(str(tiny_model_dir)), max_new_tokens=12)


def test_invoke_returns_text_and_token_metadata(chat: HFChatModel) -> None:
    reply = chat.invoke([HumanMessage("hello")])
    assert isinstance(reply.content, str)
    meta = reply.response_metadata
    assert len(meta["completion_ids"]) == len(meta["logprobs"]) > 0
    assert reply.usage_metadata["output_tokens"] == len(meta["completion_ids"])


def test_stream_yields_the_same_text_in_pieces(chat: HFChatModel) -> None:
    pieces = [chunk.content for chunk in chat.stream([HumanMessage("hello")])]
    assert "".join(pieces) == chat.invoke([HumanMessage("hello")]).content  # greedy: equal


def test_forced_tool_call_always_yields_a_call(chat: HFChatModel) -> None:
    reply = chat.bind_tools([lookup], tool_choice="lookup").invoke([HumanMessage("find x")])
    assert reply.tool_calls and reply.tool_calls[0]["name"] == "lookup"
    assert isinstance(reply.tool_calls[0]["args"], dict)


def test_parse_tool_calls() -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    text = (
        'ok {"name": "lookup", "arguments": {"query": "a"}} and {"name": "nope", "arguments": {}}'
    )
    assert parse_tool_calls(text, tools, None) == [
        {"name": "lookup", "args": {"query": "a"}, "id": "call_0"}
    ]
    assert parse_tool_calls('{"query": "b"', tools, "lookup")[0]["args"] == {"query": "b"}
    assert parse_tool_calls("no json {", tools, None) == []


def test_message_conversion_handles_tool_turns() -> None:
    messages = [
        SystemMessage("s"),
        HumanMessage("q"),
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"query": "a"}, "id": "1"}]),
        ToolMessage("found", tool_call_id="1", name="lookup"),
    ]
    dicts = to_chat_dicts(messages)
    assert [d["role"] for d in dicts] == ["system", "user", "assistant", "user"]
    assert '"lookup"' in dicts[2]["content"] and "found" in dicts[3]["content"]


def test_chat_model_serves_as_fixed_engine_in_a_full_run(chat: HFChatModel) -> None:
    graph = build_agentflow(ScriptedPolicy([plan("lookup")]), chat, [lookup])
    state = graph.invoke(
        {"question": "What is x?"}, context=Context(max_turns=2, query_analysis=True)
    )
    assert state["termination"] in {"verifier_stop", "max_turns"}
    assert state["final_text"] is not None and "answer" in state
    nodes = [t["node"] for t in state["transitions"]]
    assert nodes[0] == "query_analysis" and nodes[-1] == "generator"
    assert "executor" in nodes and "verifier" in nodes
    assert any(r["kind"] == "action" for r in state["memory"])


def test_hf_policy_plans_in_a_full_run(tiny_model_dir: Path, chat: HFChatModel) -> None:
    policy = chat.policy
    graph = build_agentflow(policy, chat, [lookup])
    state = graph.invoke({"question": "q"}, context=Context(max_turns=2, planner_max_new_tokens=16))
    turns = [t for t in state["transitions"] if t["node"] == "planner"]
    assert len(turns) == state["turn"] == 2
    for turn in turns:
        assert len(turn["completion_ids"]) == len(turn["logprobs"]) > 0
        assert turn["prompt_ids"] == policy.encode_chat(turn["messages"])
        assert turn["sampling"]["max_new_tokens"] == 16


def test_messages_stream_mode_streams_engine_tokens(chat: HFChatModel) -> None:
    graph = build_agentflow(ScriptedPolicy([plan("lookup")]), chat, [lookup])
    chunks = [
        (message, meta)
        for message, meta in graph.stream(
            {"question": "q"}, context=Context(max_turns=1), stream_mode="messages"
        )
    ]
    by_node = {meta["langgraph_node"] for _, meta in chunks}
    assert {"verifier", "generator"} <= by_node
    generator_text = "".join(
        str(m.content) for m, meta in chunks if meta["langgraph_node"] == "generator"
    )
    final = graph.invoke({"question": "q"}, context=Context(max_turns=1))["final_text"]
    assert generator_text == final  # greedy engine: the streamed pieces are the final text
    assert sum(meta["langgraph_node"] == "generator" for _, meta in chunks) > 1
