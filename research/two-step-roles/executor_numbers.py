"""Can the untrained executor compute a two-step answer when the plan carries the numbers?

For each held-out two-step question, the python step is run by the default flow's executor
(the untrained SmolLM2 engine, smollm2 preset) under two plans a planner could write:
- `passages`: the sub-goal "Compute the answer to the question.", the context the passages the
  question needs, word for word (what a planner could copy from memory);
- `numbers`: the sub-goal names the numbers ("Compute with 4469: How high is ...?").
The score is whether the printed result is the answer. If the executor computes from such plans,
a planner trained to carry the looked-up numbers into its plan can solve these questions.

Run: `python research/two-step-roles/executor_numbers.py` (about a minute on 2 cores).
`--examples two-step` adds worked python calls whose context holds the looked-up facts
(`TWO_STEP_CALLS`: made-up names, none of the split's) to the preset's three, as an executor
preset for two-step plans would; the result goes to `executor_numbers_two_step.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
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


TWO_STEP_CALLS = [
    ("How long is the Tarn Bridge in centimetres?", "The Tarn Bridge is 812 metres long.",
     "812 * 100"),
    ("How many metres higher is Mount Ola than Mount Vik?",
     "Mount Vik is 2100 metres high. Mount Ola is 2480 metres high.", "2480 - 2100"),
    ("What is three times the weight of the Osk Bell, in kilograms?",
     "The Osk Bell weighs 640 kilograms.", "3 * 640"),
    ("How many years passed between the founding of the Rill Institute and 2015?",
     "The Rill Institute was founded in 1873.", "2015 - 1873"),
    ("How many hours longer did the Fenn Expedition last than the Brak Expedition?",
     "The Fenn Expedition lasted 96 hours. The Brak Expedition lasted 41 hours.", "96 - 41"),
]  # fmt: skip
"""Worked calls (question, context, code) in the split's forms: the code takes its numbers
from the context, in the order the question asks."""


DISTRACTORS = [
    ("Lake Orrin", "Lake Orrin is 41 metres deep."),
    ("The Sael Lighthouse", "The Sael Lighthouse was built in 1902."),
    ("Port Venna", "Port Venna is the capital of Ulmaria."),
]
"""Made-up passages a search lists after the match, in the rendered worked calls."""


def rendered(context: str, n: int) -> str:
    """`context`'s sentences as the local_search tool renders a hit list: the facts first,
    then distractors, `[rank] (id: ...) Title` above each text (`render_passages`)."""
    facts = [f if f.endswith(".") else f + "." for f in context.split(". ") if f]
    passages = [(f.split(" is ")[0].split(" was ")[0].split(" lasted ")[0]
                 .split(" weighs ")[0], f) for f in facts]  # fmt: skip
    passages += (DISTRACTORS * 2)[n % len(DISTRACTORS) :][: max(0, 3 - len(passages))]
    return "\n\n".join(
        f"[{rank}] (id: ex-{n}-{rank}) {title}\n{text}"
        for rank, (title, text) in enumerate(passages, 1)
    )


def with_two_step_calls(prompts: Any, *, render: bool = False) -> Any:
    """`prompts` whose python call examples add `TWO_STEP_CALLS` after the preset's.

    `render`: each worked call's context is a search's hit list (`rendered`), as a planner that
    copies the search tool's result into its plan would write it.
    """
    shipped = list(prompts.call_examples.get("python", []))
    sub_goal = shipped[0]["sub_goal"] if shipped else "Compute the answer."
    added = [
        {
            "question": q,
            "context": rendered(c, n) if render else c,
            "sub_goal": sub_goal,
            "arguments": {"code": code},
        }
        for n, (q, c, code) in enumerate(TWO_STEP_CALLS)
    ]
    examples = {**prompts.call_examples, "python": [*shipped, *added]}
    return dataclasses.replace(prompts, call_examples=examples)


def passages_for(question: str, corpus: list[dict[str, Any]]) -> list[str]:
    """The corpus passages whose title the question names (the facts it needs)."""
    return [p["text"] for p in corpus if p.get("title") and p["title"] in question]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--examples", choices=["shipped", "two-step", "two-step-rendered"], default="shipped"
    )
    options = parser.parse_args()
    cases = [json.loads(line) for line in DATA.open()]
    corpus = [json.loads(line) for line in CORPUS.open()]
    spec = FlowSpec.from_env(planner="default", corpus=str(CORPUS))
    prompts = spec.prompt_set()
    if options.examples != "shipped":
        prompts = with_two_step_calls(prompts, render=options.examples == "two-step-rendered")
    _, engine = load_parts(spec, prompts)
    tools = build_tools(spec, engine, prompts)
    search = next(t for t in tools if t.name == "local_search")
    executor = make_executor(engine, tools, prompts=prompts)
    runtime = SimpleNamespace(context=Context(), stream_writer=None)
    rows, right = [], {"passages": 0, "numbers": 0, "search": 0}
    for case in cases:
        facts = passages_for(case["question"], corpus)
        numbers = ", ".join(re.findall(r"\d+", " ".join(facts)))
        plans = {
            "passages": ("Compute the answer to the question.", " ".join(facts)),
            "numbers": (f"Compute with {numbers}: {case['question']}", "none"),
            # the search tool's hit list for the question, word for word (what a planner
            # could copy from memory after one search)
            "search": ("Compute the answer to the question.", search.invoke(case["question"])),
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
        f"{len(cases)}, numbers {right['numbers']}/{len(cases)}, search results "
        f"{right['search']}/{len(cases)} right ({options.examples} worked calls)"
    )
    names = {"shipped": OUT.name, "two-step": "executor_numbers_two_step.md"}
    out = OUT.with_name(names.get(options.examples, "executor_numbers_two_step_rendered.md"))
    out.parent.mkdir(parents=True, exist_ok=True)
    table = ["| id | plan | right | code | printed |", "|---|---|---|---|---|", *rows]
    out.write_text("\n".join([head, "", *table]) + "\n")
    print(head)


if __name__ == "__main__":
    main()
