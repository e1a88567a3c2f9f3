"""Graph overhead: the AgentFlow graph with instant fake models vs a bare loop of the same calls.

Run: `python bench/overhead.py [--runs 200] [--repeats 3]`. Both arms make the same model and
tool calls per step (planner, engine for arguments, tool, verifier; then the generator) with
instant scripted models, `--runs` questions of 5 steps each; the difference is what LangGraph,
state reducers, transitions and parsing cost. After an untimed warm-up of each arm, the arms run
`--repeats` times (3), their order reversed every other repeat. Prints the median and min-max of
each arm's milliseconds per step and of the pair ratios graph/loop (one a repeat); writes every
repeat's values, the provenance (commit, command, machine, load) and the `headlines` to
bench/results/overhead.json (`--out`). About 35 s at the defaults on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from measure import (
    RESULTS,
    alternate,
    check_repeats,
    figure_line,
    headline,
    provenance,
    ratios,
    spread,
    write_result,
)

from flowlearn.engine.sampling import Sampling
from flowlearn.engine.scripted import ScriptedChatModel as FakeChatModel
from flowlearn.engine.scripted import ScriptedPolicy
from flowlearn.engine.scripted import planner_turn as plan
from flowlearn.graphs import Context, build_agentflow

STEPS = 5


@tool
def echo(query: str) -> str:
    """Echo the query."""
    return query


def respond(messages, tools):  # type: ignore[no-untyped-def]
    from langchain_core.messages import AIMessage

    if tools:
        return AIMessage("", tool_calls=[{"name": "echo", "args": {"query": "x"}, "id": "1"}])
    return "Conclusion: CONTINUE <answer>x</answer>"


def graph_arm(runs: int) -> float:
    """Milliseconds a step of the graph."""
    policy, engine = ScriptedPolicy([plan("echo")]), FakeChatModel(respond=respond)
    graph = build_agentflow(policy, engine, [echo])
    context = Context(max_turns=STEPS, query_analysis=True)  # as loop_arm: an analysis call
    start = time.perf_counter()
    for _ in range(runs):
        graph.invoke({"question": "q"}, context=context)
    return (time.perf_counter() - start) / (runs * STEPS) * 1e3


def loop_arm(runs: int) -> float:
    """Milliseconds a step of the bare loop."""
    policy, engine = ScriptedPolicy([plan("echo")]), FakeChatModel(respond=respond)
    bound = engine.bind_tools([echo])
    sampling = Sampling()
    start = time.perf_counter()
    for _ in range(runs):
        engine.invoke([HumanMessage("analysis")])
        for _ in range(STEPS):
            policy.generate([{"role": "user", "content": "plan"}], sampling)
            call = bound.invoke([HumanMessage("args")]).tool_calls[0]
            echo.invoke(call["args"])
            engine.invoke([HumanMessage("verify")])
        engine.invoke([HumanMessage("answer")])
    return (time.perf_counter() - start) / (runs * STEPS) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="questions an arm a repeat (200)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each arm (3)")
    parser.add_argument("--out", type=Path, default=RESULTS / "overhead.json", help="JSON path")
    args = parser.parse_args(argv)
    check_repeats(args.repeats)
    if args.runs < 1:
        parser.error("--runs: at least 1")

    def report(repeat: int, ms: dict[str, float]) -> None:
        print(f"  repeat {repeat + 1}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in ms.items()))

    print(f"{args.runs} questions of {STEPS} steps an arm, {args.repeats} repeats ...", flush=True)
    ms = alternate(
        {"graph": lambda: graph_arm(args.runs), "bare_loop": lambda: loop_arm(args.runs)},
        args.repeats,
        on_repeat=report,
    )
    result: dict[str, Any] = provenance("overhead.py", argv) | {
        "settings": {"runs": args.runs, "steps": STEPS, "repeats": args.repeats},
        "graph_ms_per_step": spread(ms["graph"]),
        "bare_loop_ms_per_step": spread(ms["bare_loop"]),
        "overhead_ms_per_step": spread(
            [g - b for g, b in zip(ms["graph"], ms["bare_loop"], strict=True)]
        ),
        "graph_over_bare_loop": ratios(ms["graph"], ms["bare_loop"]),
    }
    same = "the same planner, engine and tool calls with instant scripted models"
    result["headlines"] = [
        headline(
            "graph, per step",
            result["graph_ms_per_step"],
            "ms",
            f"a step of the AgentFlow graph, {same}",
        ),
        headline(
            "bare loop, per step",
            result["bare_loop_ms_per_step"],
            "ms",
            f"a step of a bare Python loop, {same} as the graph",
        ),
    ]
    write_result(args.out, result)
    print(figure_line("graph_ms_per_step", result["graph_ms_per_step"]))
    print(figure_line("bare_loop_ms_per_step", result["bare_loop_ms_per_step"]))
    print(
        figure_line("graph_over_bare_loop", result["graph_over_bare_loop"]) + f"; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
