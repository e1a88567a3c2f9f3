"""Isolation under load: 200 concurrent runs through one compiled graph, no cross-talk."""

from __future__ import annotations

import re
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import Context
from flowlearn.graphs import build_agentflow as _build_agentflow
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS

RUNS = 200

# these tests script the engine by the smollm2 preset's prompt wording
build_agentflow = partial(_build_agentflow, prompts=SMOLLM2_PROMPTS)


@tool
def double(n: int) -> int:
    """Double an integer."""
    return 2 * n


def number(messages: Any) -> str:
    text = messages[-1]["content"] if isinstance(messages[-1], dict) else messages[-1].content
    return re.search(r"Question: Double (\d+)", str(text)).group(1)  # type: ignore[union-attr]


def engine() -> FakeChatModel:
    def respond(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        n = number(messages)
        if tools:
            return AIMessage("", tool_calls=[{"name": "double", "args": {"n": int(n)}, "id": n}])
        prompt = str(messages[-1].content)
        if prompt.startswith("Judge whether"):
            return f"Run {n} is done.\nConclusion: STOP"
        if prompt.startswith("Answer the question"):
            result = re.findall(r"Result: (\d+)", prompt)
            return f"<answer>{result[-1] if result else 'none'}</answer>"
        return f"Analysis of run {n}."

    return FakeChatModel(respond=respond)


@pytest.mark.slow
def test_two_hundred_concurrent_runs_do_not_share_memory(tmp_path: Path) -> None:
    policy = ScriptedPolicy([lambda m: plan("double", sub_goal=f"double {number(m)}")])
    connection = sqlite3.connect(tmp_path / "runs.sqlite", check_same_thread=False)
    graph = build_agentflow(policy, engine(), [double], checkpointer=SqliteSaver(connection))

    def run(n: int) -> dict[str, Any]:
        return graph.invoke(
            {"question": f"Double {n}"},
            config={"configurable": {"thread_id": f"run-{n}"}},
            context=Context(max_turns=2, query_analysis=True),
        )

    with ThreadPoolExecutor(max_workers=32) as pool:
        states = list(pool.map(run, range(RUNS)))

    for n, state in enumerate(states):
        assert state["question"] == f"Double {n}"
        assert state["answer"] == str(2 * n), (n, state["answer"])
        assert state["analysis"] == f"Analysis of run {n}."
        assert [r["arguments"] for r in state["memory"] if r["kind"] == "action"] == [{"n": n}]
        assert [t["node"] for t in state["transitions"]][:2] == ["query_analysis", "planner"]
        for transition in state["transitions"]:
            prompt = transition["messages"][-1]["content"]
            assert re.findall(r"Question: Double (\d+)", prompt) == [str(n)]
        saved = graph.get_state({"configurable": {"thread_id": f"run-{n}"}}).values
        assert saved["answer"] == str(2 * n) and len(saved["transitions"]) == len(
            state["transitions"]
        )
