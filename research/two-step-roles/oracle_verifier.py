"""What a perfect verifier would give the shipped planner on two-step questions: the ceiling.

The verifier is replaced by an oracle that says CONTINUE until memory holds as many tool results
as the question's `steps` (its recorded solution: a lookup then python, or two lookups then
python), then STOP; planner, engine, executor and generator are the default flow's. If the
ceiling is low, no verifier training alone can lift the default on two-step questions.

Run: `python research/two-step-roles/oracle_verifier.py [--planner default] [--limit N]`
(about 10 minutes for the 24 held-out questions on 2 cores). Results: `results/oracle_*.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from flowlearn.compose import FlowSpec, build_tools, load_parts
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.evals.harness import run_eval
from flowlearn.evals.tasks import load_cases_and_scorer
from flowlearn.graphs import build_agentflow
from flowlearn.nodes.schema.context import Context

sys.path.insert(0, str(Path(__file__).parent))
from executor_numbers import with_two_step_calls

DATA = Path("evals/data/tooluse/two_step_heldout.jsonl")
CORPUS = Path("evals/data/tooluse/two_step_corpus.jsonl")


class OracleVerifier:
    """Say CONTINUE until memory shows as many tool results as the question's steps."""

    def __init__(self, steps: dict[str, int]) -> None:
        self.steps = steps

    def generate(self, messages: Messages, sampling: Sampling, **_: Any) -> Generation:
        prompt = messages[-1]["content"]
        needed = next((n for q, n in self.steps.items() if q in prompt), 1)
        done = prompt.count("  Result: ")
        verdict = "STOP" if done >= needed else "CONTINUE"
        return Generation(text=f"Memory has {done} of {needed} results.\nConclusion: {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", default="default")
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--max-turns", type=int, default=5)
    parser.add_argument("--out", default="research/two-step-roles/results")
    parser.add_argument("--states", default=None, help="a JSONL file for each case's final state")
    parser.add_argument(
        "--executor",
        choices=["shipped", "results", "results-two-step"],
        default="shipped",
        help="the preset's executor; `results`: it also sees the earlier calls' results "
        "(`MemoryView.results`); `results-two-step`: and the worked two-step python calls",
    )
    args = parser.parse_args()
    rows = [json.loads(line) for line in DATA.open()]
    steps = {r["question"]: len(r["steps"]) for r in rows}
    spec = FlowSpec.from_env(planner=args.planner, corpus=str(CORPUS), batch_size=24)
    prompts = spec.prompt_set()
    if args.executor != "shipped":
        view = dataclasses.replace(prompts.executor_view, results=True)
        prompts = dataclasses.replace(prompts, executor_view=view)
    if args.executor == "results-two-step":
        prompts = with_two_step_calls(prompts)
    planner, engine = load_parts(spec, prompts)
    tools = build_tools(spec, engine, prompts)
    graph = build_agentflow(
        planner, engine, tools, prompts=prompts, verifier_policy=OracleVerifier(steps)
    )
    cases, score = load_cases_and_scorer(data=DATA, scorer="exact_match", limit=args.limit)
    context = Context(max_turns=args.max_turns, planner_temperature=0.0)
    results = run_eval(
        graph, cases, score, concurrency=24, context=context, states_path=args.states
    )
    right = sum(r.score for r in results)
    turns = sum(r.turns for r in results) / len(results)
    lines = [
        f"# Oracle verifier, planner {args.planner}, executor {args.executor}: "
        f"{right:.0f}/{len(results)} right, "
        f"{turns:.2f} turns a case",
        "",
        "| id | score | turns | tools | answer |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.id} | {r.score:.0f} | {r.turns} | {' '.join(r.tools)} | {str(r.answer)[:40]} |"
        for r in results
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.limit is None:
        suffix = "" if args.executor == "shipped" else f"_{args.executor}"
        (out / f"oracle_{args.planner}{suffix}.md").write_text("\n".join(lines) + "\n")
    print(lines[0])


if __name__ == "__main__":
    main()
