"""What the generator should see: its answers from the same tool results, rendered four ways.

For every held-out tool-task case, the engine's own tool call from
`research/smollm2-preset/engine_ceiling.py`
(read from research/smollm2-preset/results/engine_ceiling.json; run that first) is replayed:
arithmetic keeps the
recorded python result, a lookup reruns the recorded query on the task's corpus with `k`
passages. Each question ends with the answer instruction, as `flowlearn eval` and training ask
it. The embedded SmolLM2 generator then answers from memory shown as:
- `arguments`: the tool call's arguments shown (as the other roles see them), 5 passages, the
  question with its answer instruction;
- `no-arguments`: as `arguments`, the arguments left out;
- `no-arguments k=3`: as `no-arguments`, 3 passages;
- `two examples`: as `no-arguments k=3`, the question without its instruction
  (`bare_question`): what shipped until session 14;
- `shipped`: as `two examples`, with the worked answers as they shipped in session 14 (python's, an
  author's, Kenya's; every view's examples are ordered by tool, as the generator did then:
  the memory's tool's last, in their own order, not echoed);
- `restating reply`: as `two examples`, with the worked python answer restating the
  expression ("computed 12 * 34 and printed 408") as it once did;
- `author example`: as `two examples`, the capital example replaced by an author's, whose answer
  ends its passage ("The Glass Road is a novel written by Ana Petrov.");
- `three examples`: as `two examples`, with the author's example added;
- `question order`: as `two examples`, the capital example's reply restating the passage in the
  question's order ("the capital of Kenya is Nairobi");
- `k=1`, `k=2`: as `two examples`, with 1 or 2 passages;
- `untitled`, `untitled k=1`: as `two examples` and `k=1`, each passage's title line dropped (in the
  capital example too). Session 14, `--plan example`: two examples 11/23, untitled 11/23, untitled
  k=1 14/23 (the failures: 5 searches that missed, 3 authors answered with the novel's title).

- `no-sub-goal`: as `shipped`, each step's sub-goal left out of memory (the trained planner's
  sub-goals are its plan example's, "Find the passage that answers the question.", which the
  generator repeated as its answer): what shipped in session 19;
- `quantity`: as `no-sub-goal`, with the worked answers as they ship since session 20 (a
  quantity asked in its unit, "How long is the Kora Bridge, in metres?", answered bare, before
  the author's).

`--plan example` replays instead the calls of `research/smollm2-preset/engine_ceiling.py --plan
example` (the
tools' plan examples as sub-goals, shown in memory as such), and `--views a,b` runs only those.
`--calls FILE --corpus FILE` replay another set's calls (`research/smollm2-preset/engine_ceiling.py
--cases ...
--out FILE` writes them), e.g. `research/default-planner/outside_set.py`'s.

Prints exact-match answers right per kind for each view. Run: `python
research/smollm2-preset/generator_views.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowlearn.engine import BatchingPolicy, HFChatModel, HFPolicy
from flowlearn.evals.cases import with_answer_instruction
from flowlearn.evals.scorers import exact_match
from flowlearn.evals.tool_task import CORPUS_FILE
from flowlearn.nodes.engine_calls import role_call
from flowlearn.nodes.generator import closed_reply
from flowlearn.nodes.parsing import read_answer
from flowlearn.nodes.prompts import ANSWER_STOP, Example, MemoryView
from flowlearn.nodes.render import bare_question, memory_prompt
from flowlearn.nodes.schema.records import StepRecord
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS, WORKED_ANSWERS
from flowlearn.nodes.tools.local_search import local_search_tool

PROMPTS = SMOLLM2_PROMPTS
"""The embedded model's prompt set: the generator's template and budget, the plan sub-goals."""
CEILING = Path(__file__).parent / "results" / "engine_ceiling.json"
SUB_GOALS = {name: example["sub_goal"] for name, example in PROMPTS.plan_examples.items()}
PYTHON_EXAMPLE, _NEGATIVE, QUANTITY, AUTHOR, _DAM, KENYA_EXAMPLE, _MOUNTAIN = WORKED_ANSWERS
TWO = (PYTHON_EXAMPLE, KENYA_EXAMPLE)
"""The worked answers shipped until session 14 (the views below were measured with them)."""
_question, _memory, _ = PYTHON_EXAMPLE
RESTATING = (
    (_question, _memory, "The python tool computed 12 * 34 and printed 408. <answer>408</answer>"),
    KENYA_EXAMPLE,
)
_kenya_question, _kenya_memory, _ = KENYA_EXAMPLE
QUESTION_ORDER = (
    PYTHON_EXAMPLE,
    (
        _kenya_question,
        _kenya_memory,
        "The first passage says the capital of Kenya is Nairobi. <answer>Nairobi</answer>",
    ),
)
_KENYA_UNTITLED = (
    "[1] (id: kenya) Nairobi is the capital of Kenya.\n\n"
    "[2] (id: peru) Lima is the capital of Peru."
)
UNTITLED_EXAMPLES = (
    PYTHON_EXAMPLE,
    (
        _kenya_question,
        [{**_kenya_memory[0], "result": _KENYA_UNTITLED}, _kenya_memory[1]],
        KENYA_EXAMPLE[2],
    ),
)
VIEWS = {  # arguments shown, passages, examples, the question as the generator reads it
    "arguments": (True, 5, TWO, str),
    "no-arguments": (False, 5, TWO, str),
    "no-arguments k=3": (False, 3, TWO, str),
    "two examples": (False, 3, TWO, bare_question),
    "shipped": (False, 3, (PYTHON_EXAMPLE, AUTHOR, KENYA_EXAMPLE), bare_question),
    "restating reply": (False, 3, RESTATING, bare_question),
    "author example": (False, 3, (PYTHON_EXAMPLE, AUTHOR), bare_question),
    "three examples": (False, 3, (*TWO, AUTHOR), bare_question),
    "question order": (False, 3, QUESTION_ORDER, bare_question),
    "k=1": (False, 1, TWO, bare_question),
    "k=2": (False, 2, TWO, bare_question),
    "untitled": (False, -3, UNTITLED_EXAMPLES, bare_question),
    "untitled k=1": (False, -1, UNTITLED_EXAMPLES, bare_question),
    "no-sub-goal": (False, 3, (PYTHON_EXAMPLE, AUTHOR, KENYA_EXAMPLE), bare_question),
    "quantity": (False, 3, (PYTHON_EXAMPLE, QUANTITY, AUTHOR, KENYA_EXAMPLE), bare_question),
}
HIDDEN_SUB_GOAL = {"no-sub-goal", "quantity"}


def by_tool(memory: Sequence[StepRecord], examples: Sequence[Example]) -> list[Example]:
    """Return `examples` with the memory's last tool's last, in their own order (sessions 14-24).

    A memory with no tool call keeps the order.
    """
    tools = [r.get("tool") for r in memory if r.get("kind") == "action" and r.get("tool")]
    if not tools:
        return list(examples)
    last = tools[-1]
    return sorted(examples, key=lambda example: any(r.get("tool") == last for r in example[1]))


def replayed_memory(
    row: dict[str, Any], k: int, plan: str, corpus: Path = CORPUS_FILE
) -> list[dict[str, Any]]:
    """Return the case's memory: its recorded call, the lookup rerun with `k` passages."""
    arguments = row["arguments"] or {}
    lookup = "query" in arguments
    result = (
        local_search_tool(corpus, k=abs(k)).invoke({"query": str(arguments["query"])})
        if lookup
        else row["tool_result"]
    )
    if lookup and k < 0:  # untitled: each passage's title line dropped
        result = re.sub(r"^(\[\d+\] \(id: [^)]*\)) [^\n]*\n", r"\1 ", result, flags=re.M)
    action = {
        "turn": 1,
        "kind": "action",
        "tool": "local_search" if lookup else "python",
        "sub_goal": SUB_GOALS["local_search" if lookup else "python"]
        if plan == "example"
        else row["question"].rstrip("?."),
        "arguments": arguments,
        "result": result,
        "error": None,
    }
    return [action, {"turn": 1, "kind": "verification", "verdict": "STOP"}]


async def main(args: argparse.Namespace) -> None:
    """Answer every case under every view, 16 at a time; print right answers per kind."""
    plan, views = args.plan, args.views.split(",")
    calls = CEILING if plan == "question" else CEILING.with_name(f"{CEILING.stem}_{plan}.json")
    rows = json.loads((args.calls or calls).read_text())["rows"]
    policy = BatchingPolicy(HFPolicy.from_pretrained(None), max_batch_size=16)
    ask = role_call(
        HFChatModel(policy=policy), None, max_tokens=PROMPTS.budgets.generator, stop=[ANSWER_STOP]
    )

    async def answer(row: dict[str, Any], name: str) -> bool:
        arguments, k, examples, read = VIEWS[name]
        question = read(with_answer_instruction(row["question"]))
        state = {"question": question, "memory": replayed_memory(row, k, plan, args.corpus)}
        # As the generator ordered them when these views were measured (by tool, sessions 14-24).
        shown = by_tool(state["memory"], examples)
        messages = memory_prompt(
            PROMPTS.generator,
            state,
            shown,
            view=MemoryView(arguments=arguments, sub_goals=name not in HIDDEN_SUB_GOAL),
            system=PROMPTS.system,
        )
        reply = await asyncio.to_thread(ask, messages)
        return exact_match(read_answer(closed_reply(reply)).answer, row["reference"]).value == 1

    lookups = ["query" in (row["arguments"] or {}) for row in rows]
    for name in views:
        start = time.perf_counter()
        right = await asyncio.gather(*[answer(row, name) for row in rows])
        found = sum(r for r, lookup in zip(right, lookups, strict=True) if lookup)
        computed = sum(r for r, lookup in zip(right, lookups, strict=True) if not lookup)
        print(
            f"{name:18} lookups {found}/{sum(lookups)}, arithmetic {computed}/"
            f"{len(rows) - sum(lookups)}  ({time.perf_counter() - start:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", choices=("question", "example"), default="question")
    parser.add_argument("--views", default=",".join(VIEWS), help="comma-separated view names")
    parser.add_argument("--calls", type=Path, help="engine_ceiling.py's JSON for another set")
    parser.add_argument("--corpus", type=Path, default=CORPUS_FILE, help="that set's corpus")
    args = parser.parse_args()
    unknown = sorted(set(args.views.split(",")) - set(VIEWS))
    if unknown:
        parser.error(f"unknown views {unknown}; choose from {sorted(VIEWS)}")
    asyncio.run(main(args))
