"""Which worked answers the generator should see, and in what order, per kind of tool result.

Every train and held-out question of the tool-use task (72 of each kind) is answered by the
embedded SmolLM2 generator from a memory holding the right tool result: for a lookup, the 3
passages `local_search` returns for the question itself (the passage that answers comes
first for every one of them); for arithmetic, the right number as python prints it. The
memory's sub-goal is the tool's plan example, as the untrained planner copies it. Sets of
worked answers (`GENERATOR_EXAMPLES` is python's, an author's, Kenya's capital):
- `before`: python's and Kenya's, as shipped until session 14;
- `shipped`: all three, the memory's tool's examples last (`generator.ordered_examples`);
- `fixed order`: all three in their declared order, whatever the memory;
- `python last`: all three, python's last, whatever the memory.

Prints answers right (exact match, any acceptable answer) per relation. Session 14:
before: lookups 40/72 (authors 1/12), arithmetic 71/72; shipped: 57/72 and 72/72; python
last: 9/72 lookups; Kenya's last: 48/72 arithmetic.
Run: `python bench/generator_examples.py [--sets before,shipped] [--kinds lookup]`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from typing import Any

from flowlearn.evals.cases import with_answer_instruction
from flowlearn.evals.scorers import exact_match
from flowlearn.evals.tool_task import CORPUS_FILE, HELDOUT_FILE, TRAIN_FILE, first_answer
from flowlearn.nodes.generator import closed_reply, ordered_examples
from flowlearn.nodes.parsing import read_answer
from flowlearn.nodes.policies import BatchingPolicy, HFChatModel, HFPolicy
from flowlearn.nodes.policies.engine_calls import role_call
from flowlearn.nodes.prompts import (
    ANSWER_STOP,
    GENERATOR_EXAMPLES,
    GENERATOR_MAX_TOKENS,
    GENERATOR_PROMPT,
)
from flowlearn.nodes.render import bare_question, memory_prompt
from flowlearn.nodes.tools import python_tool
from flowlearn.nodes.tools.local_search import local_search_tool

PYTHON, _QUANTITY, AUTHOR, KENYA = GENERATOR_EXAMPLES
SETS: dict[str, tuple[Any, bool]] = {  # examples, ordered per memory
    "before": ((PYTHON, KENYA), True),
    "shipped": ((PYTHON, AUTHOR, KENYA), True),
    "fixed order": ((PYTHON, AUTHOR, KENYA), False),
    "python last": ((AUTHOR, KENYA, PYTHON), False),
}
RELATIONS = ("capital", "founded", "author", "inventor", "river", "height")


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


async def main(sets: list[str], kinds: list[str]) -> None:
    """Answer every case of `kinds` under each set, 16 at a time; print right per relation."""
    search = local_search_tool(CORPUS_FILE)
    tools = (python_tool(), search)
    sub_goals = {t.name: t.metadata["plan_example"]["sub_goal"] for t in tools}  # type: ignore[index]
    lines = [line for f in (HELDOUT_FILE, TRAIN_FILE) for line in f.read_text().splitlines()]
    cases = [json.loads(line) for line in lines]
    cases = [c for c in cases if c["kind"] in kinds]
    policy = BatchingPolicy(HFPolicy.from_pretrained(None), max_batch_size=16)
    ask = role_call(
        HFChatModel(policy=policy), None, max_tokens=GENERATOR_MAX_TOKENS, stop=[ANSWER_STOP]
    )

    async def right(case: dict[str, Any], examples: Any, ordered: bool) -> bool:
        steps = memory(case, search, sub_goals)
        shown = ordered_examples(steps, examples) if ordered else examples
        state = {"question": bare_question(with_answer_instruction(case["question"]))}
        messages = memory_prompt(
            GENERATOR_PROMPT, {**state, "memory": steps}, shown, arguments=False
        )
        reply = await asyncio.to_thread(ask, messages)
        return exact_match(read_answer(closed_reply(reply)).answer, case["answer"]).value == 1

    for name in sets:
        right_by: Counter[str] = Counter()
        total: Counter[str] = Counter()
        marks = await asyncio.gather(*[right(case, *SETS[name]) for case in cases])
        for case, mark in zip(cases, marks, strict=True):
            number = int(case["id"].rsplit("-", 1)[1])
            group = RELATIONS[number % 6] if case["kind"] == "lookup" else "arithmetic"
            right_by[group] += mark
            total[group] += 1
        groups = ", ".join(f"{g} {right_by[g]}/{total[g]}" for g in total)
        print(f"{name:12} {sum(marks)}/{len(cases)}: {groups}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated example sets")
    parser.add_argument("--kinds", default="lookup,arithmetic", help="lookup, arithmetic or both")
    args = parser.parse_args()
    unknown = sorted(set(args.sets.split(",")) - set(SETS))
    if unknown:
        parser.error(f"unknown sets {unknown}; choose from {list(SETS)}")
    asyncio.run(main(args.sets.split(","), args.kinds.split(",")))
