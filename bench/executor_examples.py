"""Which worked calls the python tool should show the untrained engine as executor.

For each arithmetic question, the embedded SmolLM2 executor writes the `python` call under a
planner's sub-goal, shown one of these sets of worked calls:
- `one`: the single call shipped until session 20 ("What is 12 times 34?" -> `12 * 34`, under
  the sub-goal "Compute 12 * 34.");
- `shipped`: `python_sandbox.CALL_EXAMPLES` (a sum of three, a difference worded in reverse
  order, a product), under the plan example's sub-goal.
Sub-goals: `trained`, what the shipped planner writes ("Find passage that answers question.",
its context too); `plan-example`, the python plan example's. Question sets: the 24 held-out
arithmetic questions, 24 in phrasings neither the task nor the worked calls use (seed 7, to
choose by), and with `--cases` another set's arithmetic (e.g. `bench/outside_set.py`'s, kept as
a test). A call is right when the tool prints exactly the answer. Wrong calls are listed.

Run: `python bench/executor_examples.py [--cases runs/outside/cases.jsonl]` (about 4 minutes on
2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

from flowlearn.evals.arithmetic import evaluate, parse_expression
from flowlearn.evals.tool_task import HELDOUT_FILE
from flowlearn.nodes.catalogue import describe_tool
from flowlearn.nodes.executor import call_example_turns, propose_arguments
from flowlearn.nodes.policies import BatchingPolicy, HFChatModel, HFPolicy
from flowlearn.nodes.prompts import EXECUTOR_PROMPT
from flowlearn.nodes.render import prompt_messages
from flowlearn.nodes.tools import default_tools
from flowlearn.nodes.tools.python_sandbox import CALL_EXAMPLES

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
EXAMPLE_SETS = {"one": [ONE], "shipped": list(CALL_EXAMPLES)}
SUB_GOALS = {  # (context, sub-goal)
    "trained": (
        "The question asks for passage that answers question.",
        "Find passage that answers question.",
    ),
    "plan-example": (
        "The question gives the numbers.",
        "Compute the question's expression with code.",
    ),
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


def arithmetic(path: Path) -> list[dict[str, Any]]:
    """Return a tool-use set's python cases."""
    cases = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [case for case in cases if case.get("tool") == "python"]


async def main(args: argparse.Namespace) -> None:
    """Propose every question's call under every example set and sub-goal; print right calls."""
    policy = BatchingPolicy(HFPolicy.from_pretrained(None), max_batch_size=16)
    engine = HFChatModel(policy=policy, max_new_tokens=128)
    tool = {t.name: t for t in default_tools(engine)}["python"]
    groups = {"held-out": arithmetic(HELDOUT_FILE), "other phrasings": other_phrasings()}
    if args.cases:
        groups[args.cases.name] = arithmetic(args.cases)

    async def call(case: dict[str, Any], shown: list[dict[str, str]], plan: tuple[str, str]):
        context, sub_goal = plan
        user = EXECUTOR_PROMPT.format(
            tool="python",
            question=case["question"],
            context=context,
            sub_goal=sub_goal,
            tool_description=describe_tool(tool),
        )
        system, asked = prompt_messages(user)
        arguments, raw, _ = await asyncio.to_thread(
            propose_arguments, engine, tool, [system, *shown, asked]
        )
        if not arguments:
            return False, raw
        printed = str(tool.invoke(arguments)).strip()
        return printed == case["answer"], arguments.get("code")

    for set_name, examples in EXAMPLE_SETS.items():
        tool.metadata = {**(tool.metadata or {}), "call_examples": examples}
        shown = call_example_turns(tool)
        for plan_name, plan in SUB_GOALS.items():
            start, counts, wrong = time.perf_counter(), [], []
            for group, cases in groups.items():
                results = await asyncio.gather(*(call(case, shown, plan) for case in cases))
                counts.append(f"{group} {sum(ok for ok, _ in results)}/{len(cases)}")
                pairs = zip(cases, results, strict=True)
                wrong += [(case["question"], code) for case, (ok, code) in pairs if not ok]
            seconds = time.perf_counter() - start
            print(f"{set_name:8} sub-goal {plan_name:12}: {', '.join(counts)}  ({seconds:.0f} s)")
            print(f"  wrong: {wrong}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, help="another tool-use set (JSONL) to test on")
    asyncio.run(main(parser.parse_args()))
