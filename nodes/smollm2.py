"""The `smollm2` preset: the prompts, worked examples and budgets tuned for the embedded 135M model.

The embedded default (SmolLM2-135M-Instruct) follows a shown reply far better than a described
one, copies the last example it sees, and answers rather than concludes. This preset holds what
it was measured to need; the study behind each choice is in `research/default-planner/`. The
composition root applies it when the planner or engine is the embedded default, and `--prompts
smollm2` (or `prompts=SMOLLM2_PROMPTS`) applies it anywhere. The shipped planner was trained with
it, so its planner prompt must stay as it is.

Compared with AgentFlow's prompts (`prompts.AGENTFLOW_PROMPTS`):
- The planner writes the tool name first, opened by a prefill, with a worked plan per tool
  about "the question": the choice is the first token the policy writes, and a small planner
  copies a plan example's question whole.
- No query analysis by default: the small engine's analyses drew the planner off its tool; the
  analysis, when asked for, sees only each tool's name and description.
- The executor sees worked calls per tool, and the question without its answer instruction.
- The generator sees worked answers (those of the memory's last tool last, the one whose result
  reads most like the memory's nearest the question, opening with what their question asks
  for), and memory without the analysis, arguments or sub-goals, which it copied over results.
- The verifier's follow-up verdict is a forced choice of " STOP" or " CONTINUE" on a local
  engine: written freely, it sometimes began a new line instead, read as CONTINUE.
- `local_search` is listed first and returns 3 passages; each role has a small budget.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from difflib import SequenceMatcher
from typing import Any

from flowlearn.nodes.prompts import Budgets, Example, MemoryView, Prompts
from flowlearn.nodes.schema.records import StepRecord

SMOLLM2_QUERY_ANALYSIS_PROMPT = """\
Analyze the question below before anyone tries to answer it.

Question: {question}

Available tools:
{tools}

In a few sentences, say: the goal of the question, the skills it needs, which of the available
tools are relevant and why, and any details worth remembering. Do not answer the question."""

SMOLLM2_PLANNER_PROMPT = """\
Decide the single next step towards answering the question.

Question: {question}

Query analysis:
{analysis}

Available tools:
{tools}

Memory of previous steps:
{memory}

This is step {turn}.

Reply in exactly this format, one field per line:
Tool Name: <exactly one of: {tool_names}>
Justification: <why this step is the right one now>
Context: <every fact from the question and memory the tool needs>
Sub-Goal: <the specific goal of this step>
{examples}"""

SMOLLM2_EXECUTOR_PROMPT = """\
Call the tool `{tool}` to achieve the sub-goal below. Fill in its arguments completely; the tool
cannot see the question or the memory, only the arguments you give it.

Question: {question}
Context: {context}
Sub-Goal: {sub_goal}

Tool description:
{tool_description}"""

SMOLLM2_VERIFIER_PROMPT = """\
Judge whether the memory below already holds enough to answer the question.

Question: {question}

Query analysis:
{analysis}

Memory of previous steps:
{memory}

Write a short analysis: is the question fully answered by the memory, are the tool results
consistent and trustworthy, is anything missing? Then end with exactly one line:
Conclusion: STOP    (if the memory is enough to answer)
Conclusion: CONTINUE    (if more steps are needed)"""

SMOLLM2_GENERATOR_PROMPT = """\
Answer the question using the memory of the steps taken.

Question: {question}

Memory of previous steps:
{memory}

Explain briefly how the memory leads to the answer, then give the final answer between
<answer> and </answer>, with nothing else inside the tags."""

SMOLLM2_PLAN_EXAMPLE = """\
Tool Name: {tool}
Justification: {justification}
Context: {context}
Sub-Goal: {sub_goal}"""

ANALYSIS_SECTION = "Query analysis:\n{analysis}\n\n"
PLANNER_REPLY_PREFIX = "Tool Name:"
"""The planner's first field, opened for it: the policy writes the rest of the plan."""
VERDICT_CHOICES = (" STOP", " CONTINUE")


# The generator's worked answers ------------------------------------------------------------

WORKED_ANSWERS: tuple[Example, ...] = (
    (
        "What is 12 * 34?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "python",
                "sub_goal": "Compute 12 * 34.",
                "arguments": {"code": "12 * 34"},
                "result": "408\n",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The python tool printed 408. <answer>408</answer>",
    ),
    (
        "What is 34 - 120?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "python",
                "sub_goal": "Compute 34 - 120.",
                "arguments": {"code": "34 - 120"},
                "result": "-86\n",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The python tool printed -86. <answer>-86</answer>",
    ),
    (
        "How long is the Kora Bridge, in metres?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the length of the Kora Bridge.",
                "arguments": {"query": "Kora Bridge length"},
                "result": "[1] (id: kora-bridge) Kora Bridge\n"
                "The Kora Bridge is 412 metres long.\n\n"
                "[2] (id: tana-dam) Tana Dam\nThe Tana Dam is 96 metres high.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says the Kora Bridge is 412 metres long. <answer>412</answer>",
    ),
    (
        "Who wrote the novel The Glass Road?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the author of The Glass Road.",
                "arguments": {"query": "The Glass Road novel author"},
                "result": "[1] (id: glass-road) The Glass Road\n"
                "The Glass Road is a novel written by Ana Petrov.\n\n"
                "[2] (id: red-hill) The Red Hill\nThe Red Hill is a novel written by Tom Berg.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says The Glass Road is a novel written by Ana Petrov. "
        "<answer>Ana Petrov</answer>",
    ),
    (
        "Who built the Tana Dam?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the builder of the Tana Dam.",
                "arguments": {"query": "Tana Dam builder"},
                "result": "[1] (id: tana-dam) Tana Dam\n"
                "The Tana Dam was built by Lena Ost.\n\n"
                "[2] (id: kora-bridge) Kora Bridge\nThe Kora Bridge was built by Ivo Marn.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says the Tana Dam was built by Lena Ost. <answer>Lena Ost</answer>",
    ),
    (
        "What is the capital of Kenya?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the capital of Kenya.",
                "arguments": {"query": "capital of Kenya"},
                "result": "[1] (id: kenya) Kenya\nNairobi is the capital of Kenya.\n\n"
                "[2] (id: peru) Peru\nLima is the capital of Peru.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says Nairobi is the capital of Kenya. <answer>Nairobi</answer>",
    ),
    (
        "What is the highest mountain of Japan?",
        [
            {
                "turn": 1,
                "kind": "action",
                "tool": "local_search",
                "sub_goal": "Find the highest mountain of Japan.",
                "arguments": {"query": "highest mountain of Japan"},
                "result": "[1] (id: japan) Japan\nThe highest mountain of Japan is Mount Fuji.\n\n"
                "[2] (id: chile) Chile\nThe highest mountain of Chile is Ojos del Salado.",
                "error": None,
            },
            {"turn": 1, "kind": "verification", "verdict": "STOP"},
        ],
        "The first passage says the highest mountain of Japan is Mount Fuji. "
        "<answer>Mount Fuji</answer>",
    ),
)
"""Worked answers shown to the generator as earlier chat turns: a number python printed and a
negative one, a quantity asked in its unit, two names that end their passage ("is a novel
written by", "was built by"), one that starts it and one that ends a "The R of X is Y."
sentence, each answered with only the answer in its tags. The engine copies the form of the
last one it sees, so `order_worked_answers` puts the nearest in form last; with a single "by"
example, founders and inventors were answered with its author's name."""

WORKED_ASKS = {
    "How long is the Kora Bridge, in metres?": "the length of the Kora Bridge",
    "Who wrote the novel The Glass Road?": "the author of The Glass Road",
    "Who built the Tana Dam?": "the builder of the Tana Dam",
    "What is the capital of Kenya?": "the capital of Kenya",
    "What is the highest mountain of Japan?": "the highest mountain of Japan",
}
"""What each worked lookup's question asks for: its reply opens with it ("The question asks for
the capital of Kenya. ...") when the memory's last tool is the example's."""

_PASSAGE_HEAD = re.compile(r"^\[\d+\] \(id: [^)]*\)[^\n]*(?:\n|$)")
"""A `local_search` passage's first line: its rank, id and title."""
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|\w+|[^\w\s]")
_OPENERS = {"the", "a", "an"}
"""Capitalised only because they open the sentence: kept as words."""


def skeleton(result: str) -> list[str]:
    """Return the word shape of `result`'s first passage sentence or first line."""
    text = result.strip()
    head = _PASSAGE_HEAD.match(text)
    if head is not None:
        text = text[head.end() :]
    line = text.split("\n", 1)[0]
    shape = []
    for index, token in enumerate(_TOKEN.findall(line)):
        if token[0].isdigit():
            shape.append("0")
        elif token[0].isupper() and not (index == 0 and token.lower() in _OPENERS):
            shape.append("X")
        else:
            shape.append(token.lower())
    return shape


def likeness(result: str, other: str) -> float:
    """Return how alike two tool results read, from 0 (nothing shared, or one empty) to 1."""
    shape, other_shape = skeleton(result), skeleton(other)
    if not shape or not other_shape:
        return 0.0
    return SequenceMatcher(None, shape, other_shape, autojunk=False).ratio()


def order_by_form(memory: Sequence[StepRecord], examples: Sequence[Example]) -> list[Example]:
    """Return `examples` with those of the memory's last tool last, the nearest in form last.

    Among the examples of the memory's last tool, the one whose result reads most like the
    memory's last result comes last (`likeness`; ties keep their order). A memory with no tool
    call keeps the order.
    """
    tool = _last_tool(memory)
    if tool is None:
        return list(examples)
    result = _last_result(memory)

    def key(example: Example) -> tuple[bool, float]:
        if not _uses(example, tool):
            return (False, 0.0)
        return (True, likeness(result, _last_result(example[1])))

    return sorted(examples, key=key)


def echo_asks(memory: Sequence[StepRecord], examples: Sequence[Example]) -> list[Example]:
    """Return `examples`, those of the memory's last tool opening with what their question asks.

    Only the memory's own tool's examples get it (`WORKED_ASKS`): with every lookup example
    echoed, answers to python's results got worse.
    """
    tool = _last_tool(memory)
    shown = []
    for example in examples:
        question, steps, reply = example
        if tool is not None and question in WORKED_ASKS and _uses(example, tool):
            reply = f"The question asks for {WORKED_ASKS[question]}. {reply}"
        shown.append((question, steps, reply))
    return shown


def order_worked_answers(
    memory: Sequence[StepRecord], examples: Sequence[Example]
) -> list[Example]:
    """Return the worked answers as shown for `memory`: ordered by form, then echoed."""
    return echo_asks(memory, order_by_form(memory, examples))


def _last_tool(memory: Sequence[StepRecord]) -> str | None:
    tools = [r.get("tool") for r in memory if r.get("kind") == "action" and r.get("tool")]
    return str(tools[-1]) if tools else None


def _last_result(memory: Sequence[StepRecord]) -> str:
    actions = [r for r in memory if r.get("kind") == "action" and r.get("tool")]
    if not actions:
        return ""
    return str(actions[-1].get("result") or actions[-1].get("error") or "")


def _uses(example: Example, tool: str) -> bool:
    return any(r.get("tool") == tool for r in example[1])


# The tools' worked plans and calls --------------------------------------------------------

SEARCH_SUB_GOAL = "Find the passage that answers the question."
PYTHON_SUB_GOAL = "Compute the question's expression with code."
"""The plan examples' sub-goals, about "the question": a small planner copies a plan example's
sub-goal whole, and one naming an example question of its own sent the executor astray."""

PLAN_EXAMPLES: dict[str, dict[str, str]] = {
    "local_search": {
        "justification": "The question asks for a fact the documents hold.",
        "context": "The question names what to look up.",
        "sub_goal": SEARCH_SUB_GOAL,
    },
    "python": {
        "justification": "The question needs an exact result, which code computes.",
        "context": "The question gives the numbers.",
        "sub_goal": PYTHON_SUB_GOAL,
    },
}

SEARCH_CALL_QUESTIONS = (
    "Who wrote the novel The Glass Road?",
    "How long is the Kora Bridge, in metres?",
    "What is the capital of Kenya?",
)
"""The executor's worked `local_search` calls: each query is its question word for word, so the
engine writes the question (or its entity) as its own query rather than a guessed answer."""

PYTHON_CALLS = (
    ("Add up 8, 15 and 27.", "8 + 15 + 27"),
    ("How much is 75 less than 620?", "620 - 75"),
    ("What is 12 times 34?", "12 * 34"),
)
"""The executor's worked `python` calls (question, code): three operations, one worded in
reverse order; with one alone, the engine copied its expression into other questions."""


def _calls(sub_goal: str, pairs: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        {"question": q, "context": q, "sub_goal": sub_goal, "arguments": arguments}
        for q, arguments in pairs
    ]


CALL_EXAMPLES: dict[str, list[dict[str, Any]]] = {
    "local_search": _calls(SEARCH_SUB_GOAL, [(q, {"query": q}) for q in SEARCH_CALL_QUESTIONS]),
    "python": _calls(PYTHON_SUB_GOAL, [(q, {"code": code}) for q, code in PYTHON_CALLS]),
}


SMOLLM2_PROMPTS = Prompts(
    name="smollm2",
    query_analysis=SMOLLM2_QUERY_ANALYSIS_PROMPT,
    analyze=False,
    brief_analysis_catalogue=True,
    planner=SMOLLM2_PLANNER_PROMPT,
    planner_analysis=ANALYSIS_SECTION,
    plan_example=SMOLLM2_PLAN_EXAMPLE,
    plan_examples=PLAN_EXAMPLES,
    planner_reply_prefix=PLANNER_REPLY_PREFIX,
    executor=SMOLLM2_EXECUTOR_PROMPT,
    executor_view=MemoryView(bare_question=True),
    call_examples=CALL_EXAMPLES,
    verifier=SMOLLM2_VERIFIER_PROMPT,
    verifier_analysis=ANALYSIS_SECTION,
    verdict_choices=VERDICT_CHOICES,
    generator=SMOLLM2_GENERATOR_PROMPT,
    generator_analysis="",
    generator_view=MemoryView(arguments=False, sub_goals=False, analysis=False, bare_question=True),
    generator_examples=WORKED_ANSWERS,
    order_examples=order_worked_answers,
    budgets=Budgets(
        query_analysis=192,
        executor=128,
        verifier=192,
        verifier_conclusion=8,
        generator=256,
        engine=384,
    ),
    tool_order=("local_search", "generalist", "python"),
    search_k=3,
)
"""The preset for the embedded SmolLM2-135M-Instruct (see the module docstring)."""
