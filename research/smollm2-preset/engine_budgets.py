"""The fixed engine before and after its stops and per-role budgets, on the embedded SmolLM2.

Two questions run through the real flow with a scripted, correct plan (`local_search` for a
capital, `python` for a product), the engine being the default SmolLM2-135M-Instruct, greedy:

- before: what the engine did until issue 18: no stop strings honoured while generating, no
  repetition rule, one 384-token budget for every call;
- after: the defaults: the generator stops at `</answer>`, a degenerate repetition ends any
  call, each role has its own budget (the smollm2 preset's, `SMOLLM2_PROMPTS.budgets`).

Prints each engine call's tokens, seconds and how it ended, the answer, and the before/after
ratio of engine seconds. Run: `python research/smollm2-preset/engine_budgets.py`. Writes
research/smollm2-preset/results/engine_budgets.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatResult
from pydantic import Field

from flowlearn.engine import HFChatModel, HFPolicy
from flowlearn.engine.sampling import Messages
from flowlearn.engine.scripted import ScriptedPolicy, planner_turn
from flowlearn.engine.stops import StopWatch
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools import default_tools

PROMPTS = SMOLLM2_PROMPTS
"""The embedded model's prompt set: its templates, examples and per-role budgets."""

RESULTS = Path(__file__).parent / "results" / "engine_budgets.json"
CASES = [
    ("What is the capital of Kenya?", "local_search", "Find the capital of Kenya."),
    ("What is 17 * 23?", "python", "Compute 17 * 23."),
]


class Measured(HFChatModel):
    """The engine, recording each call's completion tokens and finish reason."""

    calls: list[dict[str, Any]] = Field(default_factory=list)
    honour_stop: bool = True
    """False: the engine before: no stop, JSON close or repetition ends a call while it
    generates (the stop strings are cut from the text afterwards, as they were)."""

    def _watch(self, stop: list[str] | None, chat: Messages) -> StopWatch:
        if self.honour_stop:
            return super()._watch(stop, chat)
        return StopWatch(super()._watch(None, chat).decode, repetition=None)  # nothing stops

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        start = time.perf_counter()
        result = super()._generate(
            messages, stop if self.honour_stop else None, run_manager, **kwargs
        )
        meta = result.generations[0].message.response_metadata
        self.calls.append(
            {
                "tokens": len(meta.get("completion_ids") or []),
                "finish": meta.get("finish_reason"),
                "seconds": round(time.perf_counter() - start, 2),
            }
        )
        return result


class Before(Measured):
    """The engine before the budgets, which also wrote the verifier's follow-up (no `choice`)."""

    scores_choices: ClassVar[bool] = False


def engines(policy: HFPolicy) -> dict[str, Measured]:
    """Build the engine as it was before, and as it is now."""
    before = Before(policy=policy, fixed_max_new_tokens=384, repetition=None, honour_stop=False)
    return {
        "before": before,
        "after": Measured(policy=policy, max_new_tokens=PROMPTS.budgets.engine),
    }


def run_case(engine: Measured, question: str, tool: str, sub_goal: str) -> dict[str, Any]:
    """Run one question with a scripted plan; return per-call figures and the answer."""
    engine.calls.clear()
    planner = ScriptedPolicy([planner_turn(tool, sub_goal, question)])
    tools = default_tools(engine, k=PROMPTS.search_k, order=PROMPTS.tool_order)
    graph = build_agentflow(planner, engine, tools, prompts=PROMPTS)
    start = time.perf_counter()
    state = graph.invoke({"question": question}, context=Context(max_turns=1, query_analysis=True))
    total = time.perf_counter() - start
    engine_nodes = [t for t in state["transitions"] if t["node"] != "planner"]
    calls = [
        {"node": t["node"], **figures, "status": t["parse_status"], "notes": t.get("notes", [])}
        for t, figures in zip(engine_nodes, engine.calls, strict=True)
    ]
    actions = [r for r in state["memory"] if r["kind"] == "action"]
    return {
        "question": question,
        "seconds": round(total, 2),
        "engine_tokens": sum(c["tokens"] for c in engine.calls),
        "calls": calls,
        "tool_result": actions[0].get("result") if actions else None,
        "final_text": state.get("final_text"),
        "answer": state.get("answer"),
    }


def main() -> None:
    """Measure both engines on both questions; print a table and write the results."""
    policy = HFPolicy.from_pretrained(None)  # the embedded default
    results: dict[str, list[dict[str, Any]]] = {}
    for name, engine in engines(policy).items():
        results[name] = [run_case(engine, *case) for case in CASES]
    for index, (question, _, _) in enumerate(CASES):
        before, after = results["before"][index], results["after"][index]
        print(f"\n{question}")
        for label, run in (("before", before), ("after", after)):
            print(f"  {label}: {run['seconds']} s, {run['engine_tokens']} engine tokens")
            for call in run["calls"]:
                print(
                    f"    {call['node']:<15} {call['tokens']:>4} tok {call['seconds']:>7} s"
                    f"  {call['finish']}  {call['status']}"
                )
            print(f"    tool result: {str(run['tool_result'])[:60]!r}")
            print(f"    final text: {str(run['final_text'])[-120:]!r}")
            print(f"    answer: {run['answer']!r}")
        print(f"  seconds after/before: {after['seconds'] / before['seconds']:.2f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
