"""The generator: writes the final answer from memory and extracts it from its tags.

The engine is called with the stop string `</answer>`, so the reply ends with the answer
instead of running on to its budget; a chat model drops the stop string from its text (as
LangChain's `stop` means), and the generator puts it back when the reply says it stopped
there. Without a complete tag pair the answer comes from a fallback (`parsing.read_answer`),
and the transition's notes say which.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langgraph.types import RetryPolicy

from flowlearn.nodes.parsing import read_answer
from flowlearn.nodes.policies.engine_calls import EngineReply, role_call
from flowlearn.nodes.prompts import ANSWER_STOP, GENERATOR_MAX_TOKENS, GENERATOR_PROMPT
from flowlearn.nodes.render import bare_question, emit, memory_prompt, transition
from flowlearn.nodes.result_forms import likeness
from flowlearn.nodes.retry import ENGINE_RETRY
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import ParseStatus, StepRecord
from flowlearn.nodes.schema.state import State
from flowlearn.nodes.worked_answers import GENERATOR_ASKS, GENERATOR_EXAMPLES

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.runtime import Runtime

_STOPPED = {"stop", "stop_sequence"}
"""Finish reasons of a call that ended on its own or at a stop string, not at a budget."""


def closed_reply(reply: EngineReply) -> str:
    """Return the reply's text with the `</answer>` it stopped at put back.

    A model that names the stop string it ended at (`stop_sequence`) is taken at its word; one
    that only says it stopped (OpenAI's `finish_reason: "stop"`) had its tag removed when its
    text ends inside an open `<answer>`. A reply cut by its budget or a repetition keeps its
    open tag, and the answer is then a fallback.
    """
    text = reply.text
    if reply.stop_sequence == ANSWER_STOP:
        return text + ANSWER_STOP
    opening, closing = text.lower().rfind("<answer>"), text.lower().rfind(ANSWER_STOP)
    if reply.finish_reason in _STOPPED and opening > closing and text[opening + 8 :].strip():
        return text + ANSWER_STOP
    return text


Example = tuple[str, Sequence[StepRecord], str]


def ordered_examples(
    memory: Sequence[StepRecord], examples: Sequence[Example], *, by_form: bool = True
) -> list[Example]:
    """Return `examples` with those of the memory's last tool moved last, the nearest in form last.

    A small engine copies the last worked answer it is shown (`worked_answers`), so the ones of
    the memory's last tool come last, ordered by how alike their result reads to the memory's
    last result (`result_forms.likeness`; ties keep their order) unless `by_form` is off. A
    memory with no tool call keeps the order.
    """
    tool = _last_tool(memory)
    if tool is None:
        return list(examples)
    result = _last_result(memory)

    def key(example: Example) -> tuple[bool, float]:
        if not _uses(example, tool):
            return (False, 0.0)
        return (True, likeness(result, _last_result(example[1])) if by_form else 0.0)

    return sorted(examples, key=key)


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


def echoed(memory: Sequence[StepRecord], examples: Sequence[Example]) -> list[Example]:
    """Return `examples`, those of the memory's last tool opening with what their question asks.

    `worked_answers.GENERATOR_ASKS` holds the openings. Only the memory's own tool's examples get
    them: with every lookup example echoed, the engine answering python's result after them
    got 64 of 71 arithmetic answers right against 71 (bench/results/generator_examples.txt).
    """
    tool = _last_tool(memory)
    shown = []
    for example in examples:
        question, steps, reply = example
        if tool is not None and question in GENERATOR_ASKS and _uses(example, tool):
            reply = f"The question asks for {GENERATOR_ASKS[question]}. {reply}"
        shown.append((question, steps, reply))
    return shown


def generator_messages(
    state: Mapping[str, Any],
    examples: Sequence[Example] = GENERATOR_EXAMPLES,
    *,
    by_form: bool = True,
) -> list[dict[str, str]]:
    """Return the generator's prompt: the worked answers, then the question and its memory.

    The question is read without its answer instruction (`render.bare_question`), the memory
    without arguments or sub-goals (`prompts.GENERATOR_PROMPT` says why), and the examples of
    the memory's last tool come last (`ordered_examples`), opening with what their question asks
    for (`echoed`).
    """
    asked = {**state, "question": bare_question(state["question"])}
    memory = state.get("memory", [])
    shown = echoed(memory, ordered_examples(memory, examples, by_form=by_form))
    return memory_prompt(GENERATOR_PROMPT, asked, shown, arguments=False, sub_goals=False)


def make_generator(
    engine: BaseChatModel, *, retry: RetryPolicy | None = ENGINE_RETRY
) -> Callable[..., dict[str, Any]]:
    """Build the generator node over the fixed engine, its calls retried per `retry`."""
    ask = role_call(engine, retry, max_tokens=GENERATOR_MAX_TOKENS, stop=[ANSWER_STOP])

    def generator(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        messages = generator_messages(state)
        reply = ask(messages)
        text = reply.error if reply.error is not None else closed_reply(reply)
        read = read_answer(text if reply.error is None else "")
        notes = reply.notes
        if reply.error is None and read.fallback:
            notes = [*notes, f"answer from a fallback: {read.source} (no complete answer tags)"]
        tagged = not read.fallback
        emit(
            runtime,
            {"event": "answer", "answer": read.answer, "tagged": tagged, "source": read.source},
        )
        started = state.get("started_at")
        turn = state.get("turn", 0)
        status: ParseStatus = (
            "error" if reply.error else "no_answer_tags" if read.fallback else "ok"
        )
        return {
            "final_text": text,
            "answer": read.answer,
            "termination": state.get("termination"),
            "seconds": round(time.time() - started, 6) if started is not None else 0.0,
            "transitions": [
                transition(
                    "generator",
                    turn,
                    messages,
                    text,
                    status,
                    reply.seconds,
                    **({"notes": notes} if notes else {}),
                )
            ],
        }

    return generator
