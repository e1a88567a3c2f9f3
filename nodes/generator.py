"""The generator: writes the final answer from memory and extracts it from its tags.

The engine is called with the stop string `</answer>`, so the reply ends with the answer
instead of running on to its budget; a chat model drops the stop string from its text (as
LangChain's `stop` means), and the generator puts it back when the reply says it stopped
there. Without a complete tag pair the answer comes from a fallback (`parsing.read_answer`),
and the transition's notes say which.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from langgraph.types import RetryPolicy

from flowlearn.nodes.engine_calls import EngineReply, role_call
from flowlearn.nodes.parsing import read_answer
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, ANSWER_STOP, Prompts
from flowlearn.nodes.render import emit, memory_prompt, transition, within_run_budget
from flowlearn.nodes.retry import ENGINE_RETRY
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import ParseStatus
from flowlearn.nodes.schema.state import State

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


def generator_messages(
    state: Mapping[str, Any], prompts: Prompts = AGENTFLOW_PROMPTS
) -> list[dict[str, str]]:
    """Return the generator's prompt: any worked answers, then the question and its memory.

    The worked answers are ordered for the memory by `prompts.order_examples` when it is set;
    `prompts.generator_view` says what of the memory and question is shown.
    """
    examples = prompts.generator_examples
    if examples and prompts.order_examples is not None:
        examples = prompts.order_examples(state.get("memory", []), examples)
    analysis = bool(state.get("analysis")) and prompts.generator_view.analysis
    template = prompts.template("generator", analysis=analysis)
    return memory_prompt(
        template, state, examples, view=prompts.generator_view, system=prompts.system
    )


def make_generator(
    engine: BaseChatModel,
    *,
    prompts: Prompts = AGENTFLOW_PROMPTS,
    retry: RetryPolicy | None = ENGINE_RETRY,
) -> Callable[..., dict[str, Any]]:
    """Build the generator node over the fixed engine.

    Args:
        engine: The fixed chat model that writes the answer.
        prompts: The template, worked answers and budget it uses (`Prompts.generator*`).
        retry: How its transient engine errors are retried (None: never).

    """
    ask = role_call(engine, retry, max_tokens=prompts.budgets.generator, stop=[ANSWER_STOP])

    def generator(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        messages = generator_messages(state, prompts)
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

    return within_run_budget(generator)
