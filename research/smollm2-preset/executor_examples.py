"""Which worked calls the python and local_search tools should show the untrained engine.

`--tool python` (the default): for each arithmetic question, the embedded SmolLM2 executor
writes the `python` call under a planner's sub-goal, shown one of these sets of worked calls:
- `one`: the single call shipped until session 20 ("What is 12 times 34?" -> `12 * 34`, under
  the sub-goal "Compute 12 * 34.");
- `shipped`: the smollm2 preset's `PYTHON_CALLS` (a sum of three, a difference worded in reverse
  order, a product), under the plan example's sub-goal.
Sub-goals: `trained`, what the shipped planner writes ("Find passage that answers question.",
its context too); `plan-example`, the python plan example's. Question sets: the 24 held-out
arithmetic questions, 24 in phrasings neither the task nor the worked calls use (seed 7, to
choose by), and with `--cases` another set's arithmetic (e.g.
`research/default-planner/outside_set.py`'s, kept as
a test). A call is right when the tool prints exactly the answer. Wrong calls are listed.

`--tool local_search`: for each lookup (the 24 held-out, and `--cases`' on `--corpus`), the
executor writes the query shown `one` (Kenya's call alone, shipped until session 20) or
`shipped` (the smollm2 preset's `SEARCH_CALL_QUESTIONS`), under the trained planner's sub-goal
in two wordings it writes ("Find passage that answers question." and "Find the passage that
answers the question."). A call is right when the first passage found holds the answer.

Also for python, tried in session 22 on the dev set's "Add A to B." and "B take away A":
`add-to`, `take-away`, `both` (worked calls in those phrasings; none shipped,
`research/smollm2-preset/results/executor_examples.txt`). `--sets` and `--sub-goals` pick a subset
to run.

Run: `python research/smollm2-preset/executor_examples.py [--tool local_search] [--cases
runs/outside/cases.jsonl
--corpus runs/outside/corpus.jsonl] [--sets shipped both --sub-goals trained]` (about 4 minutes
on 2 cores for the default pair of sets).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import random
import time
from pathlib import Path
from typing import Any

from langchain_core.tools import BaseTool

from flowlearn.engine import BatchingPolicy, HFChatModel, HFPolicy
from flowlearn.evals.arithmetic import evaluate, parse_expression
from flowlearn.evals.tool_task import CORPUS_FILE, HELDOUT_FILE, first_answer
from flowlearn.nodes.catalogue import describe_tool
from flowlearn.nodes.executor import call_example_turns, propose_arguments
from flowlearn.nodes.prompts import Prompts
from flowlearn.nodes.render import prompt_messages
from flowlearn.nodes.smollm2 import PYTHON_CALLS, SMOLLM2_PROMPTS
from flowlearn.nodes.smollm2 import PYTHON_SUB_GOAL as COMPUTE
from flowlearn.nodes.smollm2 import SEARCH_SUB_GOAL as SEARCH
from flowlearn.nodes.tools import default_tools
from flowlearn.nodes.tools.local_search import local_search_tool

PROMPTS = SMOLLM2_PROMPTS
"""The embedded model's prompt set: the executor's template, worked calls and budget."""


def worked_calls(pairs: Any) -> list[dict[str, Any]]:
    """Return (question, code) pairs as worked `python` calls, under the plan example's sub-goal."""
    return [
        {"question": q, "context": q, "sub_goal": COMPUTE, "arguments": {"code": c}}
        for q, c in pairs
    ]


OTHER_PHRASINGS = [
    ("{a} + {b}", "What is the total of {a} and {b}?"),
    ("{a} - {b}", "Take {b} away from {a}."),
    ("{a} * {b}", "Work out {a} times {b}."),
    ("{a} + {b} + {c}", "What do {a}, {b} and {c} add up to?"),
    ("{a} - {b}", "What is the difference between {a} and {b}?"),
    ("{a} + {b}", "Add {b} to {a}."),
    ("{a} * {b} + {c}", "Take the product of {a} and {b} and add {c}."),
    ("{a} - {b}", "Reduce {a} by {b}. What is the result?"),
]
ONE = {
    "question": "What is 12 times 34?",
    "context": "What is 12 times 34?",
    "sub_goal": "Compute 12 * 34.",
    "arguments": {"code": "12 * 34"},
}
TRAINED = (
    "The question asks for passage that answers question.",
    "Find passage that answers question.",
)
KENYA = "What is the capital of Kenya?"

SUM3, LESS, TIMES = PYTHON_CALLS  # the shipped worked calls, in order
EXAMPLE_SETS = {  # None: the preset's own worked calls (`PROMPTS.call_examples`)
    "python": {
        "one": [ONE],
        "shipped": None,
        # session 22, on the dev set's "Add A to B." and "B take away A" (wrong code both)
        "add-to": worked_calls((SUM3, ("Add 40 to 560.", "560 + 40"), LESS, TIMES)),
        "take-away": worked_calls((SUM3, ("How much is 620 take away 75?", "620 - 75"), TIMES)),
        "both": worked_calls(
            (
                SUM3,
                ("Add 40 to 560.", "560 + 40"),
                ("How much is 620 take away 75?", "620 - 75"),
                TIMES,
            )
        ),
    },
    "local_search": {
        "one": [
            {"question": KENYA, "context": KENYA, "sub_goal": SEARCH, "arguments": {"query": KENYA}}
        ],
        "shipped": None,
    },
}
SUB_GOALS = {  # (context, sub-goal)
    "python": {
        "trained": TRAINED,
        "plan-example": (
            "The question gives the numbers.",
            COMPUTE,
        ),
    },
    "local_search": {
        "trained": TRAINED,
        "trained-b": ("The question asks for a passage that answers the question.", SEARCH),
    },
}


def other_phrasings(n: int = 24, seed: int = 7) -> list[dict[str, str]]:
    """Return `n` arithmetic questions in `OTHER_PHRASINGS`, with their exact answers."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        expression, question = OTHER_PHRASINGS[i % len(OTHER_PHRASINGS)]
        numbers = {"a": rng.randint(1000, 99999), "b": rng.randint(101, 9999)}
        numbers["c"] = rng.randint(10, 999)
        if "*" in expression:
            numbers["a"], numbers["b"] = rng.randint(101, 999), rng.randint(11, 999)
        value = evaluate(parse_expression(expression.format(**numbers)))
        cases.append({"question": question.format(**numbers), "answer": str(value)})
    return cases


def needing(tool: str, path: Path) -> list[dict[str, Any]]:
    """Return a tool-use set's cases that need `tool`."""
    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [case for case in cases if case.get("tool") == tool]


def right(tool: BaseTool, arguments: dict[str, Any], case: dict[str, Any]) -> bool:
    """Whether python printed exactly the answer, or the first passage found holds it."""
    try:
        output = str(tool.invoke(arguments))
    except Exception:  # arguments the tool cannot take: a wrong call
        return False
    if tool.name == "python":
        return output.strip() == first_answer(case)
    return first_answer(case).lower() in output.split("\n\n")[0].lower()


async def main(args: argparse.Namespace) -> None:
    """Propose every question's call under every example set and sub-goal; print right calls."""
    policy = BatchingPolicy(HFPolicy.from_pretrained(None), max_batch_size=16)
    engine = HFChatModel(policy=policy, max_new_tokens=128)
    if args.tool == "python":
        tools = {"": {t.name: t for t in default_tools(engine)}["python"]}
        groups = {"held-out": needing("python", HELDOUT_FILE), "other phrasings": other_phrasings()}
    else:
        tools = {"": local_search_tool(CORPUS_FILE, k=PROMPTS.search_k)}
        groups = {"held-out": needing("local_search", HELDOUT_FILE)}
    if args.cases:
        tools[args.cases.name] = (
            local_search_tool(args.corpus, k=PROMPTS.search_k) if args.corpus else tools[""]
        )
        groups[args.cases.name] = needing(args.tool, args.cases)

    async def call(case: dict[str, Any], tool: BaseTool, shown: list[dict[str, str]], plan):
        context, sub_goal = plan
        user = PROMPTS.executor.format(
            tool=tool.name,
            question=case["question"],
            context=context,
            sub_goal=sub_goal,
            tool_description=describe_tool(tool),
        )
        system, asked = prompt_messages(user, system=PROMPTS.system)
        arguments, raw, _ = await asyncio.to_thread(
            propose_arguments, engine, tool, [system, *shown, asked], PROMPTS
        )
        if not arguments:
            return False, raw
        return right(tool, arguments, case), next(iter(arguments.values()), None)

    shipped = {id(tool): call_example_turns(tool, PROMPTS) for tool in tools.values()}
    for set_name, examples in EXAMPLE_SETS[args.tool].items():
        if args.sets and set_name not in args.sets:
            continue
        for plan_name, plan in SUB_GOALS[args.tool].items():
            if args.sub_goals and plan_name not in args.sub_goals:
                continue
            start, counts, wrong = time.perf_counter(), [], []
            for group, cases in groups.items():
                tool = tools.get(group, tools[""])
                shown = shipped[id(tool)]
                if examples is not None:
                    calls = {**PROMPTS.call_examples, tool.name: examples}
                    swapped: Prompts = dataclasses.replace(PROMPTS, call_examples=calls)
                    shown = call_example_turns(tool, swapped)
                results = await asyncio.gather(*(call(c, tool, shown, plan) for c in cases))
                counts.append(f"{group} {sum(ok for ok, _ in results)}/{len(cases)}")
                pairs = zip(cases, results, strict=True)
                wrong += [(case["question"], got) for case, (ok, got) in pairs if not ok]
            seconds = time.perf_counter() - start
            print(f"{set_name:8} sub-goal {plan_name:12}: {', '.join(counts)}  ({seconds:.0f} s)")
            print(f"  wrong: {wrong}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tool", choices=("python", "local_search"), default="python")
    parser.add_argument("--cases", type=Path, help="another tool-use set (JSONL) to test on")
    parser.add_argument("--corpus", type=Path, help="its corpus, for --tool local_search")
    sets = sorted({name for by_tool in EXAMPLE_SETS.values() for name in by_tool})
    goals = sorted({name for by_tool in SUB_GOALS.values() for name in by_tool})
    parser.add_argument("--sets", nargs="+", choices=sets, help="example sets (default: all)")
    parser.add_argument("--sub-goals", nargs="+", choices=goals, help="sub-goals (default: all)")
    asyncio.run(main(parser.parse_args()))
