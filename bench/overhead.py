"""Graph overhead: the AgentFlow graph with instant fake models vs a bare loop of the same calls.

Run: `python bench/overhead.py`. Both arms make the same model and tool calls per step (planner,
engine for arguments, tool, verifier; then the generator) with instant scripted models; the
difference is what LangGraph, state reducers, transitions and parsing cost. Prints microseconds
per step for each and writes bench/results/overhead.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool

from flowlearn.engine.sampling import Sampling
from flowlearn.engine.scripted import ScriptedChatModel as FakeChatModel
from flowlearn.engine.scripted import ScriptedPolicy
from flowlearn.engine.scripted import planner_turn as plan
from flowlearn.graphs import Context, build_agentflow

RESULTS = Path(__file__).parent / "results" / "overhead.json"
STEPS, RUNS = 5, 200


@tool
def echo(query: str) -> str:
    """Echo the query."""
    return query


def respond(messages, tools):  # type: ignore[no-untyped-def]
    from langchain_core.messages import AIMessage

    if tools:
        return AIMessage("", tool_calls=[{"name": "echo", "args": {"query": "x"}, "id": "1"}])
    return "Conclusion: CONTINUE <answer>x</answer>"


def graph_arm() -> float:
    policy, engine = ScriptedPolicy([plan("echo")]), FakeChatModel(respond=respond)
    graph = build_agentflow(policy, engine, [echo])
    context = Context(max_turns=STEPS, query_analysis=True)  # as loop_arm: an analysis call
    start = time.perf_counter()
    for _ in range(RUNS):
        graph.invoke({"question": "q"}, context=context)
    return (time.perf_counter() - start) / (RUNS * STEPS) * 1e6


def loop_arm() -> float:
    policy, engine = ScriptedPolicy([plan("echo")]), FakeChatModel(respond=respond)
    bound = engine.bind_tools([echo])
    sampling = Sampling()
    start = time.perf_counter()
    for _ in range(RUNS):
        engine.invoke([HumanMessage("analysis")])
        for _ in range(STEPS):
            policy.generate([{"role": "user", "content": "plan"}], sampling)
            call = bound.invoke([HumanMessage("args")]).tool_calls[0]
            echo.invoke(call["args"])
            engine.invoke([HumanMessage("verify")])
        engine.invoke([HumanMessage("answer")])
    return (time.perf_counter() - start) / (RUNS * STEPS) * 1e6


def main() -> None:
    graph_arm(), loop_arm()  # warm up
    graph_us, loop_us = graph_arm(), loop_arm()
    result = {
        "graph_us_per_step": round(graph_us, 1),
        "bare_loop_us_per_step": round(loop_us, 1),
        "overhead_us_per_step": round(graph_us - loop_us, 1),
        "ratio": round(graph_us / loop_us, 2),
    }
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
