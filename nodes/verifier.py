"""The verifier: judges whether memory answers the question, and stores its verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from langgraph.types import RetryPolicy

from flowlearn.nodes.parsing import parse_verdict
from flowlearn.nodes.policies.engine_calls import role_call
from flowlearn.nodes.prompts import VERIFIER_MAX_TOKENS, VERIFIER_PROMPT
from flowlearn.nodes.render import emit, memory_prompt, transition
from flowlearn.nodes.retry import ENGINE_RETRY
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.state import State

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.runtime import Runtime


def make_verifier(
    engine: BaseChatModel, *, retry: RetryPolicy | None = ENGINE_RETRY
) -> Callable[..., dict[str, Any]]:
    """Build the verifier node over the fixed engine, its calls retried per `retry`."""
    ask = role_call(engine, retry, max_tokens=VERIFIER_MAX_TOKENS)

    def verifier(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        turn = state.get("turn", 0)
        messages = memory_prompt(VERIFIER_PROMPT, state)
        reply = ask(messages)
        text, seconds, error = reply.text, reply.seconds, reply.error
        verdict, clear = parse_verdict(text)
        if error is not None:  # no judgement to be had: go on to the answer
            text, verdict, clear = error, "STOP", False
        update: dict[str, Any] = {
            "verdict": verdict,
            "memory": [
                {"turn": turn, "kind": "verification", "analysis": text, "verdict": verdict}
            ],
            "transitions": [
                transition(
                    "verifier",
                    turn,
                    messages,
                    text,
                    "error" if error else "ok" if clear else "unclear",
                    seconds,
                    **reply.record(),
                )
            ],
        }
        emit(runtime, {"event": "verdict", "turn": turn, "verdict": verdict, "clear": clear})
        if verdict == "STOP":
            update["termination"] = "engine_error" if error else "verifier_stop"
        return update

    return verifier
