"""The planner's policy protocol and the backends' capabilities, as Protocols a node asks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from flowlearn.engine.sampling import Generation, Messages, Sampling


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
class NodeBinding(Protocol):
    """The policies a graph's nodes call: each trained node's own, and the base of the others.

    `NodePolicies` (an adapter per node) and the trainer's `PolicyRef` are bindings; a plain
    policy is one as every node's base (`adapters.by_node`). A graph builder asks the binding
    for a node's policy instead of checking which class it was given.
    """

    @property
    def trained(self) -> Mapping[str, Any]:
        """Each trained node's policy, by the graph node's name."""
        ...

    @property
    def base(self) -> Any:
        """The policy of every node not trained apart."""
        ...

    def for_node(self, node: str) -> Any:
        """Return the policy `node`'s calls run on: its own if trained, else the base."""
        ...


@runtime_checkable
class ServedPolicy(Protocol):
    """A policy sampled on a server (`ServerPolicy`): where, and whether prompts render here."""

    url: str
    """The server's OpenAI base URL (any password in it redacted)."""
    tokenizer: Any
    """The model's tokenizer when prompts are rendered here; None: the server renders them."""


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


def local_tokenizer(policy: object) -> Any:
    """Return the tokenizer of a policy on a local model's handle, or None (served, chat model).

    An attribute lookup rather than `isinstance(policy, LocalPolicy)`: from Python 3.12 a
    runtime Protocol is checked statically, so a wrapper whose `handle` property raises over a
    served policy (`NodeSampling`) would pass as local and fail on its first call.
    """
    handle = getattr(policy, "handle", None)
    return None if handle is None else handle.tokenizer


def policy_tokenizer(policy: object) -> Any:
    """Return the tokenizer a policy decodes with, or None (a chat model's policy, say).

    A local policy's is its handle's (`local_tokenizer`), a served one's its own `tokenizer`;
    a wrapper (`NodeSampling` and the like) is looked through by its `wrapped`.
    """
    tokenizer = local_tokenizer(policy)
    if tokenizer is None:
        tokenizer = getattr(policy, "tokenizer", None)
    inner = getattr(policy, "wrapped", None)
    return tokenizer if tokenizer is not None or inner is None else policy_tokenizer(inner)
