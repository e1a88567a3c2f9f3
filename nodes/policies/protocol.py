"""The planner's policy protocol, and an adapter that lets a chat model plan (inference only)."""

from __future__ import annotations

import time
from typing import Any, Protocol, runtime_checkable

from langchain_core.language_models import BaseChatModel

from flowlearn.nodes.messages import to_langchain
from flowlearn.nodes.schema.sampling import Generation, Messages, Sampling


@runtime_checkable
class Policy(Protocol):
    """A trainable planner backend: chat messages in, text plus exact tokens out."""

    def generate(self, messages: Messages, sampling: Sampling) -> Generation:
        """Sample one completion for `messages`."""
        ...


@runtime_checkable
class PrefillPolicy(Protocol):
    """A policy that may continue a final assistant message (a prefill) rather than reply anew.

    Policies that render the model's chat template themselves (`HFPolicy`, `BatchingPolicy`,
    `ServerPolicy`, training's vLLM policy) set `continues_prefill = True`, so a planner with a
    reply prefix opens their reply with it; a chat-model policy or a user's own gets the plain
    prompt.
    """

    continues_prefill: bool


@runtime_checkable
class ChoosingModel(Protocol):
    """A chat model a call may give `choice=[...]`: it replies with the likeliest of them."""

    def can_choose(self) -> bool:
        """Say whether this model can score choices (a local model's scores are at hand)."""
        ...


def continues_prefill(policy: object) -> bool:
    """Say whether `policy` continues a prefill (`PrefillPolicy` with the flag on)."""
    return isinstance(policy, PrefillPolicy) and policy.continues_prefill is True


def can_choose(engine: object) -> bool:
    """Say whether `engine` can reply by choice (`ChoosingModel` that says it can)."""
    return isinstance(engine, ChoosingModel) and engine.can_choose()


class ChatModelPolicy:
    """Use any LangChain chat model as the planner, for inference only.

    Its transitions carry text but no token ids, so training refuses them. When the model has
    `temperature` / `top_p` fields (as most LangChain chat models do), the requested values are
    applied to a copy of it, so planner sampling settings are never silently dropped.
    """

    def __init__(self, model: BaseChatModel, *, version: str | None = None) -> None:
        self.model = model
        self.version = version or type(model).__name__

    def generate(self, messages: Messages, sampling: Sampling) -> Generation:
        """Call the chat model once and wrap its text."""
        model = self.model
        fields = type(model).model_fields
        update: dict[str, Any] = {
            k: getattr(sampling, k) for k in ("temperature", "top_p") if k in fields
        }
        if update:
            model = model.model_copy(update=update)
        start = time.perf_counter()
        reply = model.invoke(to_langchain(messages))
        return Generation(
            text=reply.text,
            policy_version=self.version,
            sampling=sampling.as_dict(),
            seconds=time.perf_counter() - start,
        )
