"""Can the untrained executor compute a two-step answer when the plan carries the numbers?

For each held-out two-step question, the python step is run by the default flow's executor
(the untrained SmolLM2 engine, smollm2 preset) under two plans a planner could write:
- `passages`: the sub-goal "Compute the answer to the question.", the context the passages the
  question needs, word for word (what a planner could copy from memory);
- `numbers`: the sub-goal names the numbers ("Compute with 4469: How high is ...?").
The score is whether the printed result is the answer. If the executor computes from such plans,
a planner trained to carry the looked-up numbers into its plan can solve these questions.

Run: `python research/two-step-roles/executor_numbers.py` (about a minute on 2 cores).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from flowlearn.compose import FlowSpec, build_tools, load_parts
from flowlearn.nodes.executor import make_executor
from flowlearn.nodes.schema.context import Context

DATA = Path("evals/data/tooluse/two_step_heldout.jsonl")
CORPUS = Path("evals/data/tooluse/two_step_corpus.jsonl")
OUT = Path("research/two-step-roles/results/executor_numbers.md")


def passages_for(question: str, corpus: list[dict[str, Any]]) -> list[str]:
    """The corpus passages whose title the question names (the facts it needs)."""
    return [p["text"] for p in corpus if p.get("title") and p["title"] in question]


def main() -> None:
    cases = [json.loads(line) for line in DATA.open()]
    corpus = [json.loads(line) for line in CORPUS.open()]
    spec = FlowSpec.from_env(planner="default", corpus=str(CORPUS))
    prompts = spec.prompt_set()
    _, engine = load_parts(spec, prompts)
    tools = build_tools(spec, engine, prompts)
    executor = make_executor(engine, tools, prompts=prompts)
    runtime = SimpleNamespace(context=Context(), stream_writer=None)
    rows, right = [], {"passages": 0, "numbers": 0}
    for case in cases:
        facts = passages_for(case["question"], corpus)
        numbers = ", ".join(re.findall(r"\d+", " ".join(facts)))
        plans = {
            "passages": ("Compute the answer to the question.", " ".join(facts)),
            "numbers": (f"Compute with {numbers}: {case['question']}", "none"),
        }
        for name, (sub_goal, context) in plans.items():
            plan = {"turn": 2, "justification": "", "context": context, "sub_goal": sub_goal,
                    "tool": "python"}  # fmt: skip
            state = {"question": case["question"], "plan": plan, "turn": 2, "memory": []}
            record = executor(state, runtime)["memory"][0]
            printed = str(record.get("result") or record.get("error") or "").strip()
            ok = printed.replace(",", "") == case["answer"]
            right[name] += ok
            code = json.dumps(record.get("arguments"))[:80]
            rows.append(f"| {case['id']} | {name} | {int(ok)} | `{code}` | {printed[:30]} |")
    head = (
        f"# Executor from plans that carry the numbers: passages {right['passages']}/"
        f"{len(cases)}, numbers {right['numbers']}/{len(cases)} right"
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    table = ["| id | plan | right | code | printed |", "|---|---|---|---|---|", *rows]
    OUT.write_text("\n".join([head, "", *table]) + "\n")
    print(head)


if __name__ == "__main__":
    main()
