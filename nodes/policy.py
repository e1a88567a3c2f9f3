"""The planner's policy protocol, and an adapter that lets a chat model plan (inference only)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel

Messages = list[dict[str, str]]
"""Chat messages as plain `{"role": ..., "content": ...}` dicts, the form transitions store."""


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Sampling settings for one policy call."""

    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 512
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    def as_dict(self) -> dict[str, Any]:
        """Return the settings as a JSON-serializable dict."""
        return asdict(self)


@dataclass(kw_only=True)
class Generation:
    """What one policy call produced.

    `prompt_ids`, `completion_ids` and `logprobs` are the exact tokens fed and sampled, with the
    log-probability of each sampled token under the sampling distribution actually used (after
    temperature). They are `None` when the backend cannot provide them (a chat-model adapter).
    """

    text: str
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    """What the backend changed on the way, e.g. a prompt cut to fit the model's window."""

    @property
    def token_faithful(self) -> bool:
        """Whether this generation carries the token ids and logprobs training needs."""
        return self.completion_ids is not None and self.logprobs is not None


@runtime_checkable
class Policy(Protocol):
    """A trainable planner backend: chat messages in, text plus exact tokens out."""

    def generate(self, messages: Messages, sampling: Sampling) -> Generation:
        """Sample one completion for `messages`."""
        ...


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
        from flowlearn.nodes.messages import to_langchain

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
