"""What the untrained planner's first turn looks like under each planner-prompt layout.

Training can only reinforce a choice that depends on the question. This samples the embedded
SmolLM2's first planner turn (T=0.7, as the recipe samples) for training questions of both
kinds, each with the query analysis the embedded engine writes for it (greedy, once), under:
- `tool-last`: AgentFlow's field order (`Tool Name:` last, `Justification:` prefilled) with
  plan examples about an example question of their own (python's "Compute 12 * 34.",
  local_search's Eiffel Tower), the prompt up to session 11;
- `tool-first`: the same with `Tool Name:` first (and prefilled), so the choice is the first
  token the policy writes, read straight after the prompt instead of after a copied plan;
- `shipped`: the smollm2 preset's (`nodes/smollm2.py`): the tool name first, and plan examples about
  "the question", so that a copied sub-goal still points the executor at the question.
It counts, out of all samples: plans that parse and name an enabled tool, the right tool for the
question's kind, sub-goals copied from a plan example, and sub-goals that
name the question's content (a capitalised word after its first, or a number of 3+ digits).

Run: `python research/smollm2-preset/planner_first_turns.py [questions per kind] [samples]
[layouts...]`
(defaults 10, 3 and all three; about 5 minutes a layout on 2 cores).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import sys
from collections import Counter
from typing import Any

from flowlearn.engine import BatchingPolicy, HFChatModel, HFPolicy
from flowlearn.engine.sampling import Sampling
from flowlearn.evals.cases import with_answer_instruction
from flowlearn.evals.tool_task import CORPUS_FILE, TRAIN_FILE
from flowlearn.nodes import planner as planner_module
from flowlearn.nodes.catalogue import render_catalogue
from flowlearn.nodes.parsing import match_tool_name, parse_planner_output
from flowlearn.nodes.prompts import Prompts
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools import default_tools

PROMPTS = SMOLLM2_PROMPTS
"""The embedded model's prompt set: the shipped layout, and the base of the others."""
PLANNER_PROMPT = PROMPTS.planner

FIELDS = (
    "Justification: <why this step is the right one now>\n"
    "Context: <every fact from the question and memory the tool needs>\n"
    "Sub-Goal: <the specific goal of this step>\n"
)
TOOL_LINE = "Tool Name: <exactly one of: {tool_names}>\n"
EXAMPLE_FIELDS = "Justification: {justification}\nContext: {context}\nSub-Goal: {sub_goal}"
TOOL_LAST = (
    PLANNER_PROMPT.replace(TOOL_LINE + FIELDS, FIELDS + TOOL_LINE),
    EXAMPLE_FIELDS + "\nTool Name: {tool}",
    "Justification:",
)
CONCRETE = {
    "python": {
        "justification": "The question needs an exact result, which code computes.",
        "context": "The numbers are 12 and 34.",
        "sub_goal": "Compute 12 * 34.",
    },
    "local_search": {
        "justification": "The question asks for a fact the documents hold.",
        "context": "The question names the Eiffel Tower.",
        "sub_goal": "Find the year the Eiffel Tower was completed.",
    },
}
SHIPPED = (PLANNER_PROMPT, PROMPTS.plan_example, PROMPTS.planner_reply_prefix)
LAYOUTS: dict[str, tuple[str, str, str | None, dict[str, dict[str, str]] | None]] = {
    # name: (the prompt, one worked plan, the prefilled first label, plan examples by tool)
    "tool-last": (*TOOL_LAST, CONCRETE),
    "tool-first": (*SHIPPED, CONCRETE),
    "shipped": (*SHIPPED, None),
}
COPIED = ("eiffel", "12 * 34", "the question's expression", "answers the question")


def layout(name: str) -> Prompts:
    """Return the preset with the planner's prompt, worked plan, prefill and plan examples of the
    layout `name` (None: the preset's own plan examples)."""
    planner, plan_example, prefix, examples = LAYOUTS[name]
    return dataclasses.replace(
        PROMPTS,
        planner=planner,
        plan_example=plan_example,
        planner_reply_prefix=prefix,
        plan_examples=PROMPTS.plan_examples if examples is None else examples,
    )


def names_question(sub_goal: str, question: str) -> bool:
    """Whether the sub-goal names the question's entity (a capitalised word) or its numbers."""
    words = re.findall(r"[A-Za-z]+|\d+", question)[1:]
    wanted = {w for w in words if w[0].isupper() or (w.isdigit() and len(w) >= 3)}
    return any(re.search(rf"\b{re.escape(w)}\b", sub_goal) for w in wanted)


def training_questions(per_kind: int) -> list[dict[str, Any]]:
    """The first `per_kind` training questions of each kind."""
    cases = [json.loads(line) for line in TRAIN_FILE.read_text().splitlines()]
    kinds: Counter[str] = Counter()
    chosen = []
    for case in cases:
        if kinds[case["tool"]] < per_kind:
            kinds[case["tool"]] += 1
            chosen.append({**case, "question": with_answer_instruction(case["question"])})
    return chosen


async def main(per_kind: int, samples: int) -> None:
    """Sample first turns under every layout and print the counts."""
    cases = training_questions(per_kind)
    policy = BatchingPolicy(HFPolicy.from_pretrained(None), max_batch_size=16)
    engine = HFChatModel(policy=policy, max_new_tokens=192)
    tools = default_tools(
        engine, corpus=str(CORPUS_FILE), k=PROMPTS.search_k, order=PROMPTS.tool_order
    )
    catalogue = render_catalogue(tools)
    context = Context(max_turns=1)
    analyses = await asyncio.gather(
        *[
            engine.ainvoke(planner_module.analysis_messages(c["question"], tools, PROMPTS))
            for c in cases
        ]
    )
    sampling = Sampling(temperature=0.7, max_new_tokens=context.planner_max_new_tokens)

    async def first_turn(case: dict[str, Any], analysis: str, prompts: Prompts) -> Counter[str]:
        prefix = prompts.planner_reply_prefix
        messages = planner_module.plan_messages(
            {"question": case["question"]},
            context,
            tools,
            analysis=analysis,
            tools=catalogue,
            turn=1,
            prefill=True,
            prompts=prompts,
        )
        gen = await asyncio.to_thread(
            policy.generate, messages, sampling, **planner_module.plan_stop(policy, prefix)
        )
        decision = parse_planner_output(planner_module.with_reply_prefix(gen.text, prefix))
        tool = match_tool_name(decision.tool_name, [t.name for t in tools])
        found: Counter[str] = Counter(samples=1)
        if decision.ok and tool is not None:
            found["parsed"] += 1
            found["right tool"] += tool == case["tool"]
            found[f"chose {tool}"] += 1
            found["copied"] += any(c in decision.sub_goal.lower() for c in COPIED)
            found["names question"] += names_question(decision.sub_goal, case["question"])
        return found

    for name in sys.argv[3:] or LAYOUTS:
        shown = layout(name)
        jobs = [
            first_turn(case, str(a.content), shown)
            for case, a in zip(cases, analyses, strict=True)
            for _ in range(samples)
        ]
        counts = sum(await asyncio.gather(*jobs), Counter())
        total = counts["samples"]
        print(
            f"{name:10}: parsed {counts['parsed']}/{total}, right tool {counts['right tool']}, "
            f"copied an example {counts['copied']}, names the question {counts['names question']}; "
            + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()) if k.startswith("chose")),
            flush=True,
        )


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:3]]
    asyncio.run(main(*(args + [10, 3][len(args) :])))
