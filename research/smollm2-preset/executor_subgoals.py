"""How the untrained engine's tool calls depend on the planner's sub-goal and the question's text.

For each held-out tool-task question, the embedded SmolLM2 executor proposes the right tool's
arguments (`python` for arithmetic, `local_search` for lookups) under three sub-goals:
- `eiffel`: the local_search plan example's sub-goal, which the untrained planner copies into
  most plans ("Find the year the Eiffel Tower was completed.");
- `copy-own-example`: the chosen tool's own plan example (python's "Compute 12 * 34.");
- `question`: the question itself, as a good planner would write it;
each with the question as `flowlearn eval` asks it (answer instruction kept) and as the
executor reads it (`bare_question`). A call is right when the tool's output holds the answer.

Run: `python research/smollm2-preset/executor_subgoals.py [--cases FILE --corpus FILE]` (about 10
minutes on 2
cores for the 48 held-out cases); `--cases` and `--corpus` run another tool-use set, e.g.
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
from flowlearn.evals.cases import with_answer_instruction
from flowlearn.evals.tool_task import CORPUS_FILE, HELDOUT_FILE, first_answer
from flowlearn.nodes.catalogue import describe_tool
from flowlearn.nodes.executor import call_example_turns, propose_arguments
from flowlearn.nodes.render import bare_question, prompt_messages
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools import default_tools

PROMPTS = SMOLLM2_PROMPTS
"""The embedded model's prompt set: the executor's template, worked calls and budget."""

EIFFEL = "Find the year the Eiffel Tower was completed."
SUB_GOALS = {
    "eiffel": lambda case: EIFFEL,
    "copy-own-example": lambda case: "Compute 12 * 34." if case["tool"] == "python" else EIFFEL,
    "question": lambda case: case["question"].rstrip("?.") + ".",
}


async def main(args: argparse.Namespace) -> None:
    """Propose every case's call under every sub-goal and question text; print right calls."""
    cases = [json.loads(line) for line in args.cases.read_text().splitlines()]
    policy = BatchingPolicy(HFPolicy.from_pretrained(None), max_batch_size=16)
    engine = HFChatModel(policy=policy, max_new_tokens=128)
    every = default_tools(
        engine, corpus=str(args.corpus), k=PROMPTS.search_k, order=PROMPTS.tool_order
    )
    tools = {t.name: t for t in every}

    async def right(case: dict[str, Any], sub_goal: str, bare: bool) -> bool:
        tool = tools[case["tool"]]
        question = with_answer_instruction(case["question"])
        user = PROMPTS.executor.format(
            tool=tool.name,
            question=bare_question(question) if bare else question,
            context="The question is given.",
            sub_goal=sub_goal,
            tool_description=describe_tool(tool),
        )
        system, asked = prompt_messages(user, system=PROMPTS.system)
        messages = [system, *call_example_turns(tool, PROMPTS), asked]
        arguments, _, _ = await asyncio.to_thread(
            propose_arguments, engine, tool, messages, PROMPTS
        )
        if arguments is None:
            return False
        try:
            result = str(tool.invoke(arguments))
        except Exception as exc:  # a failed call is a wrong call here
            result = str(exc)
        return first_answer(case).lower() in result.lower()

    for bare in (False, True):
        for name, sub_goal in SUB_GOALS.items():
            start = time.perf_counter()
            calls = [right(case, sub_goal(case), bare) for case in cases]
            results = await asyncio.gather(*calls)
            kinds = [case["tool"] for case in cases]
            python = sum(r for r, k in zip(results, kinds, strict=True) if k == "python")
            search = sum(r for r, k in zip(results, kinds, strict=True) if k != "python")
            n_python = kinds.count("python")
            print(
                f"question {'bare' if bare else 'as asked'}, sub-goal {name:16}: python "
                f"{python}/{n_python}, local_search {search}/{len(kinds) - n_python}  "
                f"({time.perf_counter() - start:.0f} s)",
                flush=True,
            )
            wrong = [c["question"] for c, r in zip(cases, results, strict=True) if not r]
            print(f"  wrong: {wrong}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=Path, default=HELDOUT_FILE, help="tool-use cases (JSONL)")
    parser.add_argument("--corpus", type=Path, default=CORPUS_FILE, help="their corpus (JSONL)")
    asyncio.run(main(parser.parse_args()))
