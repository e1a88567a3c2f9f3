"""Conversions between plain message dicts (stored in transitions) and LangChain messages."""

from __future__ import annotations

from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

_CLASSES: dict[str, type[BaseMessage]] = {
    "system": SystemMessage,
    "user": HumanMessage,
    "assistant": AIMessage,
}


def to_langchain(messages: Sequence[dict[str, str]]) -> list[BaseMessage]:
    """Turn `{"role", "content"}` dicts into LangChain messages.

    Raises:
        ValueError: a role other than system, user or assistant.

    """
    out: list[BaseMessage] = []
    for message in messages:
        role = message["role"]
        if role not in _CLASSES:
            raise ValueError(f"unknown message role {role!r}; use one of {sorted(_CLASSES)}")
        out.append(_CLASSES[role](content=message["content"]))
    return out
