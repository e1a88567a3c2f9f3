"""The generator: writes the final answer from memory and extracts it from its tags."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from langgraph.types import RetryPolicy

from flowlearn.nodes.parsing import extract_answer
from flowlearn.nodes.prompts import GENERATOR_PROMPT
from flowlearn.nodes.render import call_engine, emit, engine_call, memory_prompt, transition
from flowlearn.nodes.retry import ENGINE_RETRY
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.state import State

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.runtime import Runtime


def make_generator(
    engine: BaseChatModel, *, retry: RetryPolicy | None = ENGINE_RETRY
) -> Callable[..., dict[str, Any]]:
    """Build the generator node over the fixed engine, its calls retried per `retry`."""
    ask = engine_call(engine, retry)

    def generator(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        messages = memory_prompt(GENERATOR_PROMPT, state)
        text, seconds, error = call_engine(ask, messages)
        answer, tagged = extract_answer(text)
        if error is not None:
            text, answer, tagged = error, "", False
        emit(runtime, {"event": "answer", "answer": answer, "tagged": tagged})
        started = state.get("started_at")
        turn = state.get("turn", 0)
        return {
            "final_text": text,
            "answer": answer,
            "termination": state.get("termination"),
            "seconds": round(time.time() - started, 6) if started is not None else 0.0,
            "transitions": [
                transition(
                    "generator",
                    turn,
                    messages,
                    text,
                    "error" if error else "ok" if tagged else "no_answer_tags",
                    seconds,
                )
            ],
        }

    return generator
