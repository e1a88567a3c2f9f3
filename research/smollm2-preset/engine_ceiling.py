"""How far the untrained embedded engine lets any planner get on the tool-use task.

Every held-out question of `evals/data/tooluse` runs through the real flow with a perfect,
scripted plan: the right tool for its kind (`python` for arithmetic, `local_search` for a
lookup), the question itself as sub-goal and context. The fixed engine is the embedded
SmolLM2-135M-Instruct, greedy, as in `flowlearn run`: it writes the query analysis, the tool
call and the answer. Whatever a trained planner does, its accuracy on this task is at most what
this perfect plan reaches, since the plan is all the planner writes.

`--plan example` writes instead the right tool's own plan example (its justification, context
and sub-goal, e.g. "Find the passage that answers the question."): the plan of a planner that
learned the tool choice and copies the prompt's example for the rest, as the embedded planner
does (research/smollm2-preset/planner_first_turns.py).

Prints, per question and in total:
- `tool`: the tool's result holds the reference answer (the executor's call was right);
- `answer`: the flow's answer matches the reference (exact match, the task's scorer);
- how often the verifier said STOP (with one turn the flow answers either way; with more, a
  CONTINUE runs another planner turn).

Run: `python research/smollm2-preset/engine_ceiling.py [--limit N] [--plan question|example]
[--cases FILE
--corpus FILE --out FILE]`. Writes research/smollm2-preset/results/engine_ceiling.json (`--plan
example`:
engine_ceiling_example.json) unless `--out` names another file; `--cases` and `--corpus` run
another tool-use set (cases with `question`, `answer`, `tool`), e.g.
`research/default-planner/outside_set.py`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from flowlearn.engine import BatchingPolicy, HFChatModel, HFPolicy
from flowlearn.engine.scripted import ScriptedPolicy, planner_turn
from flowlearn.evals.cases import with_answer_instruction
from flowlearn.evals.scorers import exact_match, normalize_answer
from flowlearn.evals.tool_task import CORPUS_FILE, HELDOUT_FILE, first_answer
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools import default_tools

PROMPTS = SMOLLM2_PROMPTS
"""The embedded model's prompt set: its templates, worked examples, budgets and tools' k."""

RESULTS = Path(__file__).parent / "results" / "engine_ceiling.json"


def plan(case: dict[str, Any], tools: list[Any], kind: str) -> str:
    """The case's right tool, with the question as sub-goal and context, or its plan example."""
    if kind == "question":
        return planner_turn(case["tool"], case["question"].rstrip("?."), case["question"])
    example = PROMPTS.plan_examples[case["tool"]]
    return PROMPTS.plan_example.format(tool=case["tool"], **example)  # as the prompt shows it


async def run_case(
    case: dict[str, Any], engine: HFChatModel, tools: list[Any], kind: str
) -> dict[str, Any]:
    """Run one case with its right-tool plan; return what the tool and the flow answered."""
    planner = ScriptedPolicy([plan(case, tools, kind)])
    graph = build_agentflow(planner, engine, tools, prompts=PROMPTS)
    question = with_answer_instruction(case["question"])  # as `flowlearn eval` asks it
    state = await graph.ainvoke(
        {"question": question}, context=Context(max_turns=1, query_analysis=True)
    )
    actions = [m for m in state["memory"] if m.get("kind") == "action"]
    result = str(actions[0].get("result") or actions[0].get("error")) if actions else ""
    answer = str(state.get("answer") or "")
    verdicts = [m.get("verdict") for m in state["memory"] if m.get("kind") == "verification"]
    return {
        "id": case["id"],
        "question": case["question"],
        "reference": case["answer"],
        "arguments": actions[0].get("arguments") if actions else None,
        "tool_result": result[:200],
        "tool_right": normalize_answer(first_answer(case)) in normalize_answer(result),
        "answer": answer[:200],
        "answer_right": exact_match(answer, case["answer"]).value == 1.0,
        "verdict": verdicts[-1] if verdicts else None,
    }


async def main(args: argparse.Namespace) -> None:
    """Run the cases 16 at a time on one engine; print and save the figures."""
    kind = args.plan
    cases = [json.loads(line) for line in args.cases.read_text().splitlines()][: args.limit]
    policy = HFPolicy.from_pretrained(None)  # the embedded default
    engine = HFChatModel(
        policy=BatchingPolicy(policy, max_batch_size=16), max_new_tokens=PROMPTS.budgets.engine
    )
    names = ("python", "local_search")
    every = default_tools(
        engine, corpus=str(args.corpus), k=PROMPTS.search_k, order=PROMPTS.tool_order
    )
    tools = [t for t in every if t.name in names]
    start = time.perf_counter()
    rows = await asyncio.gather(*[run_case(case, engine, tools, kind) for case in cases])
    seconds = time.perf_counter() - start
    for row in rows:
        print(
            f"tool {'ok' if row['tool_right'] else '--'}  answer "
            f"{'ok' if row['answer_right'] else '--'}  {row['question']}  "
            f"(ref {row['reference']!r}, answered {row['answer'][:50]!r})"
        )
    n = len(rows)
    tool_right = sum(r["tool_right"] for r in rows)
    answer_right = sum(r["answer_right"] for r in rows)
    print(
        f"\n{n} cases of {args.cases.name} with the right tool ({kind} plan), the untrained "
        f"engine: the tool's result held the answer in {tool_right}/{n}, the flow answered "
        f"right in {answer_right}/{n} ({seconds:.0f} s)"
    )
    kinds = {"lookups": "local_search", "arithmetic": "python"}
    for label, tool in kinds.items():
        mine = [r for r, c in zip(rows, cases, strict=True) if c["tool"] == tool]
        print(
            f"{label}: tool {sum(r['tool_right'] for r in mine)}/{len(mine)}, answer "
            f"{sum(r['answer_right'] for r in mine)}/{len(mine)}"
        )
    stops = [r for r in rows if r["verdict"] == "STOP"]
    print(
        f"verifier STOP in {len(stops)}/{n}: {sum(r['tool_right'] for r in stops)} of the "
        f"{tool_right} whose tool result held the answer"
    )
    default = RESULTS if kind == "question" else RESULTS.with_name(f"{RESULTS.stem}_{kind}.json")
    out = args.out or default
    out.parent.mkdir(exist_ok=True)
    summary = {"cases": n, "plan": kind, "tool_right": tool_right, "answer_right": answer_right}
    out.write_text(json.dumps({"summary": summary, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=48, help="cases to run (48)")
    parser.add_argument("--cases", type=Path, default=HELDOUT_FILE, help="tool-use cases (JSONL)")
    parser.add_argument("--corpus", type=Path, default=CORPUS_FILE, help="their corpus (JSONL)")
    parser.add_argument("--out", type=Path, help="the JSON results file")
    parser.add_argument(
        "--plan",
        choices=("question", "example"),
        default="question",
        help="sub-goal and context: the question itself, or the tool's plan example",
    )
    args = parser.parse_args()
    asyncio.run(main(args))
