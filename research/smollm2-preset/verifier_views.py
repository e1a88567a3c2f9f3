"""How well the untrained engine's verifier judges one step's memory, under prompt variants.

For every held-out tool-task case, the call the engine made under the right tool's plan example
(`research/smollm2-preset/engine_ceiling.py --plan example`, read from
research/smollm2-preset/results/engine_ceiling_example.json;
run that first) is replayed into memory as `research/smollm2-preset/generator_views.py` does: a
lookup reruns its
query on the task's corpus (3 passages, as shipped), arithmetic keeps its python output. The
engine writes each question's query analysis once, as the flow does. The embedded SmolLM2
verifier then judges the memory. Its verdict is right when it says STOP where the tool's output
holds the reference answer and CONTINUE where it does not.

Views:
- `shipped`: the verifier's prompt as the flow renders it;
- `examples`: with two worked verdicts first (a python result that answers: STOP; passages that
  name nothing asked: CONTINUE), as the generator's worked answers;
- `stop last`: the prompt's two conclusion lines in the other order (a small model copies the
  last line it read);
- `prefilled`: the reply starts with `Conclusion:` written for it, so its first word is the
  verdict (the shipped replies hold no `Conclusion:` line: the engine answers the question).

Run: `python research/smollm2-preset/verifier_views.py [--views a,b]` (about 2 minutes a view on 2
cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from generator_views import replayed_memory

from flowlearn.engine import BatchingPolicy, HFChatModel, HFPolicy
from flowlearn.evals.cases import with_answer_instruction
from flowlearn.evals.tool_task import CORPUS_FILE
from flowlearn.nodes.engine_calls import role_call
from flowlearn.nodes.parsing import parse_verdict
from flowlearn.nodes.planner import analysis_messages
from flowlearn.nodes.render import memory_prompt
from flowlearn.nodes.schema.records import StepRecord
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools import default_tools

PROMPTS = SMOLLM2_PROMPTS
"""The embedded model's prompt set: the verifier's and query analysis's templates and budgets."""
VERIFIER_PROMPT = PROMPTS.verifier
CALLS = Path(__file__).parent / "results" / "engine_ceiling_example.json"
STOP_LINE = "Conclusion: STOP    (if the memory is enough to answer)"
CONTINUE_LINE = "Conclusion: CONTINUE    (if more steps are needed)"
STOP_LAST = VERIFIER_PROMPT.replace(
    f"{STOP_LINE}\n{CONTINUE_LINE}", f"{CONTINUE_LINE}\n{STOP_LINE}"
)
assert STOP_LAST != VERIFIER_PROMPT, "the verifier's conclusion lines changed: update STOP_LINE"


def _action(tool: str, sub_goal: str, arguments: dict[str, str], result: str) -> StepRecord:
    return {
        "turn": 1,
        "kind": "action",
        "tool": tool,
        "sub_goal": sub_goal,
        "arguments": arguments,
        "result": result,
        "error": None,
    }


EXAMPLES: tuple[tuple[str, list[StepRecord], str], ...] = (
    (
        "What is 12 * 34?",
        [_action("python", "Compute 12 * 34.", {"code": "print(12 * 34)"}, "408\n")],
        "The python tool printed 408, the product asked for.\nConclusion: STOP",
    ),
    (
        "What is the capital of Kenya?",
        [
            _action(
                "local_search",
                "Find the capital of Kenya.",
                {"query": "capital of Kenya"},
                "[1] (id: peru) Peru\nLima is the capital of Peru.\n\n"
                "[2] (id: chile) Chile\nSantiago is the capital of Chile.",
            )
        ],
        "The passages name the capitals of Peru and Chile, not Kenya's.\nConclusion: CONTINUE",
    ),
)
VIEWS = {  # the prompt, worked verdicts, what the reply opens with
    "shipped": (VERIFIER_PROMPT, (), ""),
    "examples": (VERIFIER_PROMPT, EXAMPLES, ""),
    "stop last": (STOP_LAST, (), ""),
    "prefilled": (VERIFIER_PROMPT, (), "Conclusion:"),
}


async def main(views: list[str]) -> None:
    """Judge every case under every view, 16 at a time; print right verdicts."""
    rows = json.loads(CALLS.read_text())["rows"]
    policy = BatchingPolicy(HFPolicy.from_pretrained(None), max_batch_size=16)
    engine = HFChatModel(policy=policy)
    tools = default_tools(
        engine, corpus=str(CORPUS_FILE), k=PROMPTS.search_k, order=PROMPTS.tool_order
    )
    analyse = role_call(engine, None, max_tokens=PROMPTS.budgets.query_analysis)
    judge = role_call(engine, None, max_tokens=PROMPTS.budgets.verifier)
    questions = [with_answer_instruction(row["question"]) for row in rows]
    analyses = await asyncio.gather(
        *[asyncio.to_thread(analyse, analysis_messages(q, tools, PROMPTS)) for q in questions]
    )

    async def verdict(row: dict[str, Any], question: str, analysis: Any, name: str) -> str:
        template, examples, prefill = VIEWS[name]
        memory = replayed_memory(row, 3, "example")[:1]
        state = {"question": question, "analysis": analysis.text, "memory": memory}
        messages = memory_prompt(template, state, examples, system=PROMPTS.system)
        if prefill:
            messages.append({"role": "assistant", "content": prefill})
        reply = await asyncio.to_thread(judge, messages)
        return parse_verdict(reply.text)[0]

    held = [row["tool_right"] for row in rows]
    for name in views:
        start = time.perf_counter()
        verdicts = await asyncio.gather(
            *[verdict(row, q, a, name) for row, q, a in zip(rows, questions, analyses, strict=True)]
        )
        stops = sum(v == "STOP" for v, h in zip(verdicts, held, strict=True) if h)
        continues = sum(v == "CONTINUE" for v, h in zip(verdicts, held, strict=True) if not h)
        print(
            f"{name:10} STOP where the result held the answer {stops}/{sum(held)}, CONTINUE "
            f"where it did not {continues}/{len(held) - sum(held)}  "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--views", default=",".join(VIEWS), help="comma-separated view names")
    chosen = parser.parse_args().views.split(",")
    unknown = sorted(set(chosen) - set(VIEWS))
    if unknown:
        parser.error(f"unknown views {unknown}; choose from {sorted(VIEWS)}")
    asyncio.run(main(chosen))
