"""What the executor's search queries find: the 24 held-out lookups under three tool set-ups.

The embedded SmolLM2 executor writes a `local_search` call for each held-out lookup of the
tool-use task, under the plan the untrained planner copies (the tool's own plan example, its
sub-goal "Find the passage that answers the question."). Each set-up changes only what the
executor is shown of the tool:
- `shipped`: the tool as it ships;
- `no-example`: its worked calls (the smollm2 preset's `call_examples["local_search"]`) removed;
- `notes`: no worked call, the usage notes saying "Use the question's own words as the query.".

Prints, per set-up, how often the passage holding the answer came back, and how often first.
Session 14 (before the worked call shipped): no-example 17/24 found, 17 first; with the
question-as-query example 24/24, 24 first; notes 15/24.
Run: `python research/smollm2-preset/executor_lookups.py [--setups shipped,no-example]`.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

from langchain_core.tools import BaseTool

from flowlearn.engine import BatchingPolicy, HFChatModel, HFPolicy
from flowlearn.evals.tool_task import CORPUS_FILE, HELDOUT_FILE, first_answer
from flowlearn.graphs import Context
from flowlearn.nodes import make_executor
from flowlearn.nodes.prompts import Prompts
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools.local_search import local_search_tool

SETUPS = ("shipped", "no-example", "notes")
PROMPTS = SMOLLM2_PROMPTS
"""The embedded model's prompt set: the executor's template, worked calls and budget."""


def search_tool(setup: str) -> BaseTool:
    """Return `local_search` over the task corpus as `setup` shows it to the executor."""
    tool = local_search_tool(CORPUS_FILE, k=PROMPTS.search_k)
    metadata = copy.deepcopy(tool.metadata or {})
    if setup == "notes":
        metadata["usage_notes"] = "Use the question's own words as the query."
    tool.metadata = metadata
    return tool


def setup_prompts(setup: str) -> Prompts:
    """Return the preset as `setup` shows it: without `local_search`'s worked calls but shipped."""
    if setup == "shipped":
        return PROMPTS
    calls = {name: c for name, c in PROMPTS.call_examples.items() if name != "local_search"}
    return dataclasses.replace(PROMPTS, call_examples=calls)


def main(setups: list[str]) -> None:
    """Run the executor on every held-out lookup under each set-up, 16 at a time."""
    cases = [json.loads(line) for line in HELDOUT_FILE.read_text().splitlines()]
    lookups = [case for case in cases if case["tool"] == "local_search"]
    engine = HFChatModel(policy=BatchingPolicy(HFPolicy.from_pretrained(None), max_batch_size=16))
    runtime = SimpleNamespace(context=Context(), stream_writer=lambda event: None)
    plan = {"turn": 1, "tool": "local_search", **PROMPTS.plan_examples["local_search"]}
    for setup in setups:
        node = make_executor(engine, [search_tool(setup)], prompts=setup_prompts(setup))

        def call(case: dict[str, Any], node: Any = node) -> dict[str, Any]:
            return node({"question": case["question"], "plan": plan}, runtime)["memory"][0]

        with ThreadPoolExecutor(16) as pool:
            records = list(pool.map(call, lookups))
        found = first = 0
        for case, record in zip(lookups, records, strict=True):
            result = str(record.get("result"))
            found += first_answer(case) in result
            first += first_answer(case) in result.split("\n\n")[0]
            print(f"{setup:10} {case['question']} -> {record.get('arguments')}")
        print(f"== {setup}: found {found}/{len(lookups)}, first {first}/{len(lookups)}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setups", default=",".join(SETUPS), help="comma-separated set-ups")
    args = parser.parse_args()
    unknown = sorted(set(args.setups.split(",")) - set(SETUPS))
    if unknown:
        parser.error(f"unknown set-ups {unknown}; choose from {list(SETUPS)}")
    main(args.setups.split(","))
