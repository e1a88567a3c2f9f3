"""The agents' calls to the fixed engine: a role's budget and stop strings bound, its ending read.

Each engine role (query analysis, verifier, generator) binds its own token budget as
LangChain's standard `max_tokens` and its stop strings as `stop`, so any chat model honours
them, and reads back from the reply how the call ended (`finish_reason`, `stop_sequence`,
`notes`, as `HFChatModel` writes them) for the node's transition.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from langgraph.types import RetryPolicy

from flowlearn.engine.chat import to_langchain
from flowlearn.engine.sampling import Messages
from flowlearn.nodes.retry import engine_error, retrying

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel


@dataclass(frozen=True)
class EngineReply:
    """One engine call's text and timing, how it ended, or the error that ended it."""

    text: str
    seconds: float
    error: str | None = None
    """The call's error, retries spent (`nodes.retry.engine_error`); the text is then empty."""
    finish_reason: str | None = None
    """"stop", "length", "repetition", ... as the chat model reports it; None if it does not."""
    stop_sequence: str | None = None
    """The stop string the call ended at (the text omits it), when the model reports one."""
    notes: list[str] = field(default_factory=list)
    """What the engine said about the call (a stop, a repetition, a spent budget)."""

    def record(self) -> dict[str, Any]:
        """Return the transition fields this reply adds: its notes, when there are any."""
        return {"notes": list(self.notes)} if self.notes else {}


RoleCall = Callable[[Messages], EngineReply]
"""A bound engine call: messages in, the reply out (retries already inside)."""


def role_call(
    engine: BaseChatModel,
    retry: RetryPolicy | None,
    *,
    max_tokens: int | None = None,
    stop: Sequence[str] = (),
    choice: Sequence[str] = (),
) -> RoleCall:
    """Bind `engine` with a role's budget and stop strings, or a `choice`; retry per `retry`.

    A `choice` (a local engine's, `HFChatModel`) is the list the reply must be one of.

    The returned call never raises: an error that outlives the retries comes back as
    `EngineReply.error`, which the node records, and the run goes on.

    Raises:
        ValueError: both a budget or stop strings and a choice, or neither a budget nor a choice.

    """
    if (max_tokens is None) == (not choice) or (choice and stop):
        raise ValueError(
            "an engine role's call is written (max_tokens, maybe stop) or chosen (choice alone)"
        )
    settings: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens}
    if stop:
        settings["stop"] = list(stop)
    if choice:  # the reply is one of these, the likeliest (`HFChatModel`, `engine.local.choose`)
        settings["choice"] = list(choice)
    bound = engine.bind(**settings)

    def invoke(messages: Messages) -> EngineReply:
        start = time.perf_counter()
        reply = bound.invoke(to_langchain(messages))
        meta = reply.response_metadata or {}
        notes = meta.get("notes")
        return EngineReply(
            text=reply.text,
            seconds=time.perf_counter() - start,
            finish_reason=meta.get("finish_reason") or meta.get("stop_reason"),
            stop_sequence=meta.get("stop_sequence"),
            notes=[str(n) for n in notes] if isinstance(notes, list) else [],
        )

    with_retries = retrying(invoke, retry)

    def call(messages: Messages) -> EngineReply:
        start = time.perf_counter()
        try:
            return with_retries(messages)
        except Exception as exc:
            return EngineReply("", time.perf_counter() - start, error=engine_error(exc))

    return call
