"""The verifier: judges whether memory answers the question, and stores its verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flowlearn.nodes.parsing import parse_verdict
from flowlearn.nodes.prompts import VERIFIER_PROMPT
from flowlearn.nodes.render import emit, invoke_text, memory_prompt, transition

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.runtime import Runtime

    from flowlearn.graphs.context import Context
    from flowlearn.graphs.state import State


def make_verifier(engine: BaseChatModel) -> Callable[..., dict[str, Any]]:
    """Build the verifier node over the fixed engine."""

    def verifier(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        step = state.get("step", 0)
        messages = memory_prompt(VERIFIER_PROMPT, state)
        text, seconds = invoke_text(engine, messages)
        verdict, clear = parse_verdict(text)
        update: dict[str, Any] = {
            "verdict": verdict,
            "memory": [
                {"step": step, "kind": "verification", "analysis": text, "verdict": verdict}
            ],
            "transitions": [
                transition("verifier", step, messages, text, "ok" if clear else "unclear", seconds)
            ],
        }
        emit(runtime, {"event": "verdict", "step": step, "verdict": verdict, "clear": clear})
        if verdict == "STOP":
            update["termination"] = "verifier_stop"
        return update

    return verifier
