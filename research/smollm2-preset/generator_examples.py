"""Which worked answers the generator should see, and in what order, per kind of tool result.

Each question is answered by the embedded SmolLM2 generator from a memory holding the right tool
result: for a lookup, the 3 passages `local_search` returns for the question itself; for
arithmetic, the right number as python prints it. The prompt is the generator node's own
(`generator.generator_messages` with the smollm2 preset: no arguments, no sub-goals, the memory's
tool's examples last).
The questions are the tool-use task's train and held-out sets (72 of each kind), or a set given
by `--cases FILE --corpus FILE`: `research/default-planner/outside_set.py`'s outside set, or its
`--relations dev`
set (a third set of relations, made to choose prompts on so the outside set stays a test).
Sets of worked answers:
- `before`, `session 14`: python's and Kenya's; python's, the author's, Kenya's;
- `shipped`: the smollm2 preset's `WORKED_ANSWERS` (python's 408 and -86, the Kora Bridge
  length, the author's, the Tana Dam's builder, Kenya's, Japan's highest mountain), the
  memory's tool's ordered by form, the nearest last (`smollm2.order_by_form`, session 25);
  `session 25` and `was written` likewise; every other set is shown as before session 25, the
  memory's tool's examples last in their own order (`order_by_tool` here);
- `session 25`: the six shipped then (no Tana Dam); `was written`: those with the author's
  passage in the passive ("The Glass Road was written by Ana Petrov.");
- `by tool`: the four shipped in sessions 20-24 (python's 408, the length, the author's, Kenya's);
- `kenya first`: Kenya's before the length and the author's (answers ending their passage last);
- `negative`, `two pythons`, `negative last`: python's example printing -86 instead of 408, both
  with 408's last, both with -86's last;
- `currency`: a fifth, "What is the currency of Peru?" ("The currency of Peru is the sol.")
  before Kenya's; `kenya first currency`: Kenya's first, the currency's last;
- `answers last`: the currency's added and Kenya's passage reworded so that every answer ends
  its sentence ("The capital of Kenya is Nairobi.");
- `untitled`: every passage shown without its id and title line, the examples' too;
- `bare replies`: each reply only the tagged answer.
Since session 21 the node opens its own tool's worked lookup replies with what the question asks
for ("The question asks for the capital of Kenya.", `smollm2.echo_asks`), in every set here;
measured as the set `question echo` before it shipped: lookups task 61/72, dev 13/21, outside
10/12 (shipped then: 56, 12, 7); echoed in every memory, arithmetic fell to 64/71.

Session 14 (task set): before: lookups 40/72 (authors 1/12), arithmetic 71/72; session 14's
three: 57/72 and 72/72; python's last for lookups: 9/72; Kenya's last for arithmetic: 48/72.
Session 21, lookups right (task 72 / dev 21 / outside 12) and arithmetic: see
research/smollm2-preset/results/generator_examples.txt. No set beat `shipped` on every set: the
engine picks the
sentence's subject or the passage title, whichever example comes last.
Session 25 (`by tool` against `shipped`): dev 24 -> 36 of 42 (negatives 1 -> 11 of 11, lookups
13 -> 15 of 21), outside 21 -> 23 of 24, task 132 -> 131 of 144 (inventors 11 -> 8 of 12).
Session 26 (`session 25` against `shipped`, the Tana Dam's added), lookups: task 59 -> 62 of 72
(inventors 8 -> 12), dev 15 -> 17 of 21, outside 11 of 12 both.
Run: `python research/smollm2-preset/generator_examples.py [--sets shipped,untitled] [--kinds
lookup] [--show]`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowlearn.engine import BatchingPolicy, HFChatModel, HFPolicy
from flowlearn.evals.cases import with_answer_instruction
from flowlearn.evals.scorers import exact_match
from flowlearn.evals.tool_task import CORPUS_FILE, HELDOUT_FILE, TRAIN_FILE, first_answer
from flowlearn.nodes.engine_calls import role_call
from flowlearn.nodes.generator import closed_reply, generator_messages
from flowlearn.nodes.parsing import read_answer
from flowlearn.nodes.prompts import ANSWER_STOP, Example, Prompts
from flowlearn.nodes.schema.records import StepRecord
from flowlearn.nodes.smollm2 import (
    SMOLLM2_PROMPTS,
    WORKED_ANSWERS,
    echo_asks,
    order_worked_answers,
)
from flowlearn.nodes.tools import python_tool
from flowlearn.nodes.tools.local_search import local_search_tool

PROMPTS = SMOLLM2_PROMPTS
"""The embedded model's prompt set: the generator's template, view, worked answers and budget."""
PYTHON, NEGATIVE, QUANTITY, AUTHOR, DAM, KENYA, MOUNTAIN = WORKED_ANSWERS
SESSION_24 = (PYTHON, QUANTITY, AUTHOR, KENYA)
"""The worked answers shipped in sessions 20-24, shown in order of tool only."""


def _lookup(question: str, passages: list[tuple[str, str]], answer: str) -> Any:
    """A worked lookup answer: the passages found (title, sentence), the first one answering."""
    result = "\n\n".join(
        f"[{i}] (id: {title.lower().replace(' ', '-')}) {title}\n{text}"
        for i, (title, text) in enumerate(passages, 1)
    )
    action = {"turn": 1, "kind": "action", "tool": "local_search", "sub_goal": question,
              "arguments": {"query": question}, "result": result, "error": None}  # fmt: skip
    reply = f"The first passage says {passages[0][1][0].lower()}{passages[0][1][1:-1]}. "
    return (question, [action, {"turn": 1, "kind": "verification", "verdict": "STOP"}],
            f"{reply}<answer>{answer}</answer>")  # fmt: skip


CURRENCY = _lookup(
    "What is the currency of Peru?",
    [("Peru", "The currency of Peru is the sol."), ("Chile", "The currency of Chile is the peso.")],
    "sol",
)
KENYA_LAST_WORD = _lookup(  # Kenya's, its passage ending with the answer
    "What is the capital of Kenya?",
    [("Kenya", "The capital of Kenya is Nairobi."), ("Peru", "The capital of Peru is Lima.")],
    "Nairobi",
)
WAS_WRITTEN = _lookup(  # the author's, its passage in the passive of most "by" relations
    "Who wrote the novel The Glass Road?",
    [("The Glass Road", "The Glass Road was written by Ana Petrov."),
     ("The Red Hill", "The Red Hill was written by Tom Berg.")],
    "Ana Petrov",
)  # fmt: skip
SETS: dict[str, tuple[Any, ...]] = {  # examples, the memory's tool's last
    "before": (PYTHON, KENYA),
    "session 14": (PYTHON, AUTHOR, KENYA),
    "shipped": WORKED_ANSWERS,
    "by tool": SESSION_24,
    "was written": (PYTHON, NEGATIVE, QUANTITY, WAS_WRITTEN, KENYA, MOUNTAIN),
    "session 25": (PYTHON, NEGATIVE, QUANTITY, AUTHOR, KENYA, MOUNTAIN),
    "kenya first": (PYTHON, KENYA, QUANTITY, AUTHOR),
    "negative": (NEGATIVE, QUANTITY, AUTHOR, KENYA),
    "currency": (PYTHON, QUANTITY, AUTHOR, CURRENCY, KENYA),
    "kenya first currency": (PYTHON, KENYA, QUANTITY, AUTHOR, CURRENCY),
    "answers last": (PYTHON, QUANTITY, AUTHOR, CURRENCY, KENYA_LAST_WORD),
    "two pythons": (NEGATIVE, PYTHON, QUANTITY, AUTHOR, KENYA),
    "negative last": (PYTHON, NEGATIVE, QUANTITY, AUTHOR, KENYA),
}
_PASSAGE = re.compile(r"\[(\d+)\] \(id: [^)]*\) [^\n]*\n")


def untitled(steps: Any) -> Any:
    """`steps` with each passage's id and title line dropped ("[1] Nairobi is the ...")."""
    return [{**s, "result": _PASSAGE.sub(r"[\1] ", s["result"])} if s.get("tool") == "local_search"
            else s for s in steps]  # fmt: skip


SETS["untitled"] = tuple((q, untitled(m), r) for q, m, r in SESSION_24)
_TAGS = re.compile(r"<answer>.*</answer>")
SETS["bare replies"] = tuple((q, m, _TAGS.search(r)[0]) for q, m, r in SESSION_24)  # type: ignore[index]
BY_TOOL = set(SETS) - {"shipped", "was written", "session 25"}
"""Sets measured before session 25, shown as then: the memory's tool's examples last, in order."""
RELATIONS = ("capital", "founded", "author", "inventor", "river", "height")


def order_by_tool(memory: Sequence[StepRecord], examples: Sequence[Example]) -> list[Example]:
    """Return `examples` as shown before session 25: the memory's last tool's last, in order.

    Then echoed, as the preset's (`smollm2.echo_asks`); a memory with no tool call keeps the
    order.
    """
    tools = [r.get("tool") for r in memory if r.get("kind") == "action" and r.get("tool")]
    if not tools:
        return echo_asks(memory, examples)
    last = tools[-1]
    ordered = sorted(examples, key=lambda example: any(r.get("tool") == last for r in example[1]))
    return echo_asks(memory, ordered)


def shown_with(examples: Sequence[Example], by_form: bool) -> Prompts:
    """Return the preset with `examples` as its worked answers, ordered by form or by tool only."""
    order = order_worked_answers if by_form else order_by_tool
    return dataclasses.replace(PROMPTS, generator_examples=examples, order_examples=order)


def group(case: dict[str, Any]) -> str:
    """The case's relation (the task's, by its number) or its question's first words."""
    if case["kind"] != "lookup":
        return "negative" if first_answer(case).startswith("-") else "arithmetic"
    if case["id"].startswith(("train-", "heldout-")):
        return RELATIONS[int(case["id"].rsplit("-", 1)[1]) % 6]
    return " ".join(case["question"].split()[:3])


def memory(case: dict[str, Any], search: Any, sub_goals: dict[str, str]) -> list[Any]:
    """Return the case's memory: the right tool's call and result, then a STOP verdict."""
    tool = case["tool"]
    result = (
        search.invoke({"query": case["question"]})
        if tool == "local_search"
        else f"{first_answer(case)}\n"
    )
    arguments = {"query": case["question"]} if tool == "local_search" else {"code": "..."}
    action = {"turn": 1, "kind": "action", "tool": tool, "sub_goal": sub_goals[tool]}
    action.update({"arguments": arguments, "result": result, "error": None})
    return [action, {"turn": 1, "kind": "verification", "verdict": "STOP"}]


async def main(sets: list[str], kinds: list[str], files: Any, show: bool = False) -> None:
    """Answer every case of `kinds` under each set, 16 at a time; print right per relation."""
    search = local_search_tool(files.corpus or CORPUS_FILE, k=PROMPTS.search_k)
    tools = (python_tool(), search)
    sub_goals = {t.name: PROMPTS.plan_examples[t.name]["sub_goal"] for t in tools}
    sources = files.cases or [HELDOUT_FILE, TRAIN_FILE]
    lines = [line for f in sources for line in Path(f).read_text().splitlines()]
    cases = [json.loads(line) for line in lines]
    cases = [c for c in cases if c["kind"] in kinds]
    policy = BatchingPolicy(HFPolicy.from_pretrained(None), max_batch_size=16)
    ask = role_call(
        HFChatModel(policy=policy), None, max_tokens=PROMPTS.budgets.generator, stop=[ANSWER_STOP]
    )

    async def right(case: dict[str, Any], examples: Any, by_form: bool) -> bool:
        steps = memory(case, search, sub_goals)
        if examples == SETS["untitled"]:
            steps = untitled(steps)
        state = {"question": with_answer_instruction(case["question"]), "memory": steps}
        messages = generator_messages(state, shown_with(examples, by_form))
        reply = await asyncio.to_thread(ask, messages)
        mark = exact_match(read_answer(closed_reply(reply)).answer, case["answer"]).value == 1
        if show and not mark:
            print(f"  miss: {case['question']} ({case['answer']}) -> {reply!r}", flush=True)
        return mark

    for name in sets:
        right_by: Counter[str] = Counter()
        total: Counter[str] = Counter()
        by_form = name not in BY_TOOL
        marks = await asyncio.gather(*[right(case, SETS[name], by_form) for case in cases])
        for case, mark in zip(cases, marks, strict=True):
            right_by[group(case)] += mark
            total[group(case)] += 1
        groups = ", ".join(f"{g} {right_by[g]}/{total[g]}" for g in total)
        print(f"{name:12} {sum(marks)}/{len(cases)}: {groups}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated example sets")
    parser.add_argument("--kinds", default="lookup,arithmetic", help="lookup, arithmetic or both")
    parser.add_argument("--cases", action="append", help="a case file (default: the task's)")
    parser.add_argument("--corpus", type=Path, help="its corpus (default: the task's)")
    parser.add_argument("--show", action="store_true", help="print each wrong reply")
    args = parser.parse_args()
    unknown = sorted(set(args.sets.split(",")) - set(SETS))
    if unknown:
        parser.error(f"unknown sets {unknown}; choose from {list(SETS)}")
    if bool(args.cases) != bool(args.corpus):
        parser.error("--cases and --corpus go together: a set's questions and its passages")
    asyncio.run(main(args.sets.split(","), args.kinds.split(","), args, args.show))
