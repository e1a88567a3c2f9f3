"""Named LoRA adapters on one base model, one per trained node: switched per call, saved, loaded.

Why it is built this way:
1. Several trained roles share one copy of the base (PEFT named adapters, each named after its
   node). A node's calls run with its adapter active (`AdapterPolicy`); the untrained roles and
   the fixed engine run with every adapter off (`FrozenBasePolicy`). All of them are built on
   one `ModelHandle`, whose lock keeps a switch from ever happening under another's forward.
2. PEFT's `set_adapter` also makes the adapter it activates trainable and freezes the others.
   Training keeps one optimizer over every adapter, so a switch made for a rollout or a
   micro-batch must not freeze the rest: `active_adapter` switches the tuner layers and puts
   every adapter's `requires_grad` back as it was. A row's gradient still reaches only its
   node's adapter: the others take no part in its forward.
3. Calls under different adapters decode in one batch (`mixed_batching`): every row names its
   adapter, and each forward passes them to PEFT (`adapter_names`, PEFT's mixed-adapter
   batches; the base's rows are `tokens.BASE_ROW`). On SmolLM2-135M (CPU, 8 rows per node, a
   256-token prompt) a decode step took 167 ms against 228 ms for a forward per adapter
   (`bench/adapter_batches.py`, results in bench/results/adapter_batches.json). PEFT refuses
   `adapter_names` in training mode: rollouts sample in eval mode, and the update switches
   adapters per micro-batch instead (`switch_adapter`).
4. A training result of several nodes is a folder with one adapter per node in `<node>/` (as
   PEFT's `save_pretrained` writes named adapters), the tokenizer, and a record
   naming the base model (`saved_adapters`), so `flowlearn run --planner FOLDER` rebuilds it
   with one base copy.
5. The record names the base so that it resolves from any folder (an absolute path, or a hub
   id) with its fingerprint (`base_fingerprint`), and loading checks it: a base named as typed
   ("tinyrel") resolved against the loading folder, and a same-shaped model put where the base
   was, would load another model under the adapters without a word. Each adapter is checked
   against the base's shapes before PEFT allocates it (`loading.check_adapter_fits`).
6. A training run builds its graph once, around a `PolicyRef`, and swaps each step's policy
   (its new weights, its batch) into it. The graph's nodes hold the reference's per-node
   fronts (`NodeRef`), which look the step's policy up at every call, so a transition records
   the version that sampled it, and nothing asks which class of policy it was given: every
   binding answers `for_node` (`protocol.NodeBinding`; a plain policy through `by_node`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.loading import (
    check_adapter_fits,
)
from flowlearn.engine.local import FrozenBasePolicy, HFPolicy, trainability_kept, tuned_parts
from flowlearn.engine.protocol import NodeBinding, continues_prefill
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.stops import StopWatch
from flowlearn.engine.tokens import BASE_ROW, ModelHandle

logger = logging.getLogger(__name__)

NODE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")


def check_node_name(name: object) -> str:
    """Return `name` if it can name a node's adapter (and its folder), else raise.

    Raises:
        ValueError: not a lowercase word of letters, digits, `_` or `-`.

    """
    if not isinstance(name, str) or not name or not set(name) <= NODE_NAME_CHARS:
        raise ValueError(
            f"node name {name!r} cannot name an adapter: use the graph node's name, lowercase "
            "letters, digits, '_' or '-' (e.g. planner, verifier)"
        )
    return name


def adapter_names(model: Any) -> list[str]:
    """Return the names of the adapters on a PEFT model (none for a plain model)."""
    config = getattr(model, "peft_config", None)
    return sorted(config) if isinstance(config, Mapping) else []


@contextlib.contextmanager
def active_adapter(model: Any, name: str) -> Iterator[None]:
    """Run the block with adapter `name` alone active, every adapter's trainability kept.

    The caller holds the model handle's lock (the policies' forward scope runs under it).

    Raises:
        ValueError: no adapter of that name on `model`.

    """
    layers, _ = tuned_parts(model)
    before = list(layers[0].active_adapters) if layers else [name]
    switch_adapter(model, name)
    try:
        yield
    finally:
        switch_adapter(model, before)


def switch_adapter(model: Any, name: str | list[str]) -> None:
    """Make adapter `name` (or several) the active one, every adapter's trainability kept.

    Raises:
        ValueError: no adapter of that name on `model`.

    """
    layers, _ = tuned_parts(model)
    names = [name] if isinstance(name, str) else list(name)
    unknown = [n for n in names if n not in adapter_names(model)]
    if unknown:
        raise ValueError(f"the model has no adapter {unknown}; it has {adapter_names(model)}")
    if not layers or list(layers[0].active_adapters) == names:
        return
    with trainability_kept(model):
        for layer in layers:
            layer.set_adapter(names)


class AdapterPolicy(HFPolicy):
    """Generate with one named adapter of a PEFT model active: one trained node's policy.

    Built on `policy`'s handle, so it shares the lock of every policy on that model (the frozen
    base's, the other nodes'): an adapter is never switched under another call's forward.
    """

    def __init__(self, policy: HFPolicy, adapter: str, *, version: str | None = None) -> None:
        """Serve adapter `adapter` of `policy`'s model, versioned `<policy version>:<adapter>`.

        Raises:
            ValueError: the model has no adapter of that name.

        """
        self._bind(policy.handle, version or f"{policy.version}:{adapter}", policy.context_window)
        if adapter not in adapter_names(policy.model):
            raise ValueError(
                f"the model has no adapter {adapter!r}; it has {adapter_names(policy.model)}"
            )
        self.adapter = adapter

    def forward_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Make this node's adapter the active one (the caller holds the handle's lock)."""
        return active_adapter(self.model, self.adapter)


@dataclass(frozen=True)
class NodeSampling:
    """A node's policy with its own top-p and token budget over the run's sampling settings.

    It keeps the wrapped policy's handle, version and prefill behaviour, so a node over it
    behaves as over the policy itself (stop watches, prefilled replies).
    """

    wrapped: Any
    top_p: float | None = None
    max_new_tokens: int | None = None

    @property
    def continues_prefill(self) -> bool:
        """Whether the wrapped policy continues a final assistant message."""
        return continues_prefill(self.wrapped)

    @property
    def handle(self) -> Any:
        """The wrapped policy's model handle (AttributeError for a policy without one)."""
        return self.wrapped.handle

    @property
    def version(self) -> str:
        """The wrapped policy's version."""
        return str(self.wrapped.version)

    def generate(self, messages: Messages, sampling: Sampling, **kwargs: Any) -> Generation:
        """Generate with this node's top-p and budget in place of the call's."""
        changes: dict[str, Any] = {}
        if self.top_p is not None:
            changes["top_p"] = self.top_p
        if self.max_new_tokens is not None:
            changes["max_new_tokens"] = self.max_new_tokens
        own = dataclasses.replace(sampling, **changes) if changes else sampling
        result: Generation = self.wrapped.generate(messages, own, **kwargs)
        return result


@dataclass(frozen=True)
class NodePolicies(Mapping[str, Any]):
    """The policies of a graph's trained nodes, by node, and the base the others run on.

    A mapping from node name to its policy (an `AdapterPolicy`, or a wrapper over one such as
    `BatchingPolicy`); `for_node` gives an untrained node the base with every adapter off.
    """

    trained: Mapping[str, Any]
    """Each trained node's policy."""
    base: Any
    """The base model with every adapter off (a `FrozenBasePolicy` or a wrapper of one)."""
    _names: tuple[str, ...] = field(init=False, repr=False, default=())

    def __post_init__(self) -> None:
        """Check the node names."""
        for name in self.trained:
            check_node_name(name)
        object.__setattr__(self, "_names", tuple(self.trained))

    def __getitem__(self, node: str) -> Any:
        """Return the trained node's policy."""
        return self.trained[node]

    def __iter__(self) -> Iterator[str]:
        """Iterate over the trained nodes."""
        return iter(self._names)

    def __len__(self) -> int:
        """Count the trained nodes."""
        return len(self._names)

    def for_node(self, node: str) -> Any:
        """Return the node's policy: its adapter's if trained, else the base's."""
        return self.trained.get(node, self.base)


def by_node(policy: Any) -> NodeBinding:
    """Return `policy` as policies by node: a binding as it is, a plain policy as every node's.

    A plain policy is the base of a `NodePolicies` with no node trained apart, so a graph
    builder asks `for_node` and `trained` whatever it was given.
    """
    return policy if isinstance(policy, NodeBinding) else NodePolicies({}, policy)


class PolicyRef(Mapping[str, Any]):
    """One swappable reference to the policy a graph calls: bound once, swapped every step.

    Built around the first step's policy (one policy, or a binding such as `NodePolicies`,
    batched or not); each later step `swap`s its own in. Like `NodePolicies` it maps each
    trained node to its policy and gives every other node the base, but each of those is a
    `NodeRef` that forwards every call to that node's policy of the current step. Called as a
    policy itself, it is the base: a graph given one policy plans on the step's.

    Swap and release only between steps, from the thread that runs them: a step's rollouts
    (threads of their own) read it while they run.
    """

    def __init__(self, target: Any) -> None:
        """Refer to `target` until swapped; its trained nodes are the reference's for good."""
        self._current: NodeBinding | None = by_node(target)
        self._base = NodeRef(self, None)
        self._fronts = {node: NodeRef(self, node) for node in self._current.trained}

    def swap(self, target: Any) -> None:
        """Send every call to `target` from now on.

        Raises:
            ValueError: `target` trains other nodes apart than the first policy did: the
                graph was built with those nodes' policies in place.

        """
        nodes = by_node(target)
        if set(nodes.trained) != set(self._fronts):
            raise ValueError(
                f"the graph was built for trained nodes {sorted(self._fronts)}; a policy that "
                f"trains {sorted(nodes.trained)} cannot be swapped in"
            )
        self._current = nodes

    def release(self) -> None:
        """Let go of the current policy, so that no step's model outlives its step here."""
        self._current = None

    def current(self, node: str | None) -> Any:
        """Return the current policy of trained `node`, or the base's (None).

        Raises:
            RuntimeError: released, and no policy swapped in since.

        """
        if self._current is None:
            raise RuntimeError("no policy is swapped in: the graph was called between steps")
        return self._current.base if node is None else self._current.for_node(node)

    @property
    def trained(self) -> Mapping[str, NodeRef]:
        """Each trained node's front."""
        return self._fronts

    @property
    def base(self) -> NodeRef:
        """The front of every node not trained apart."""
        return self._base

    def for_node(self, node: str) -> NodeRef:
        """Return `node`'s front: its own if trained, else the base's."""
        return self._fronts.get(node, self._base)

    def __getitem__(self, node: str) -> NodeRef:
        return self._fronts[node]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fronts)

    def __len__(self) -> int:
        return len(self._fronts)

    def __eq__(self, other: object) -> bool:  # by identity, not by items as a Mapping would
        return self is other

    __hash__ = object.__hash__

    @property
    def continues_prefill(self) -> bool:
        """Whether the base's current policy continues a final assistant message."""
        return self._base.continues_prefill

    def generate(self, messages: Messages, sampling: Sampling, **kwargs: Any) -> Generation:
        """Generate with the base's current policy."""
        return self._base.generate(messages, sampling, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """Read anything else (`version`, `handle`, `tokenizer`) off the base's current policy."""
        if name.startswith("_"):  # its own, not set yet (a copy being made): never forwarded
            raise AttributeError(name)
        return getattr(self._base, name)


@dataclass(frozen=True, eq=False)
class NodeRef:
    """One node's policy through a `PolicyRef`: each call goes to that node's current policy.

    Looked up at every call, so a transition records the version of the step that made it,
    and a capability (a handle, a tokenizer, a prefill) is the current policy's.
    """

    ref: PolicyRef
    node: str | None
    """The trained node whose policy it forwards to; None: the base's."""

    @property
    def target(self) -> Any:
        """The node's policy of the current step."""
        return self.ref.current(self.node)

    @property
    def continues_prefill(self) -> bool:
        """Whether the current policy continues a final assistant message."""
        return continues_prefill(self.target)

    def generate(self, messages: Messages, sampling: Sampling, **kwargs: Any) -> Generation:
        """Generate with the node's current policy (its version goes in the generation)."""
        result: Generation = self.target.generate(messages, sampling, **kwargs)
        return result

    def __getattr__(self, name: str) -> Any:
        """Read anything else (`version`, `handle`, `tokenizer`) off the current policy."""
        if name.startswith("_") or name in ("ref", "node"):  # not set yet: a copy being made
            raise AttributeError(name)
        return getattr(self.target, name)


@dataclass(frozen=True)
class AdapterBatching:
    """One node's calls, decoded in a batch that every node's adapter shares (`mixed_batching`).

    Its rows name its adapter (`BASE_ROW` for the base); it records its own policy's version,
    and streams or scores choices through that single-call policy (`scoped`).
    """

    batching: BatchingPolicy
    """The batch every node of the model shares (over a plain policy on its handle)."""
    scoped: HFPolicy
    """This node's own single-call policy: an `AdapterPolicy`, or the `FrozenBasePolicy`."""
    adapter: str
    """The adapter its rows decode under; `BASE_ROW`: none."""
    continues_prefill: ClassVar[bool] = True

    @property
    def handle(self) -> ModelHandle:
        """The shared model's handle."""
        return self.batching.handle

    @property
    def version(self) -> str:
        """The node's policy version."""
        return self.scoped.version

    def encode_chat(self, messages: Messages) -> list[int]:
        """Render `messages` with the chat template and return the prompt's token ids."""
        return self.scoped.encode_chat(messages)

    def forward_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Its own policy's scope (its adapter on, or every adapter off), for scored choices."""
        return self.scoped.forward_scope()

    def generate(
        self,
        messages: Messages,
        sampling: Sampling,
        *,
        streamer: Any = None,
        stopping: StopWatch | None = None,
    ) -> Generation:
        """Queue one call into the shared batch under this node's adapter; streams run alone."""
        if streamer is not None:
            return self.scoped.generate(messages, sampling, streamer=streamer, stopping=stopping)
        prompt, notes = self.scoped.fit_prompt(self.encode_chat(messages), sampling.max_new_tokens)
        future = self.batching.submit(
            prompt, sampling, notes, stopping=stopping, adapter=self.adapter, version=self.version
        )
        return future.result()


def mixed_batching(policies: NodeBinding, max_batch_size: int) -> NodePolicies:
    """Return `policies` decoding together: one batch of mixed adapters for every node.

    Each trained node's `AdapterPolicy` (inside a `NodeSampling`, if any) and the base become
    `AdapterBatching` fronts of one `BatchingPolicy` on their shared handle. It takes those
    concrete local policies apart (handle, adapter, sampling), so it checks their classes.
    """

    def own(policy: Any) -> HFPolicy:
        inner = policy.wrapped if isinstance(policy, NodeSampling) else policy
        if not isinstance(inner, HFPolicy):
            raise TypeError(f"mixed batching needs local policies, got {type(inner).__name__}")
        return inner

    base = own(policies.base)
    shared = BatchingPolicy(HFPolicy.on(base.handle, version=base.version), max_batch_size)

    def front(policy: Any, adapter: str) -> Any:
        batched = AdapterBatching(shared, own(policy), adapter)
        if isinstance(policy, NodeSampling):
            return dataclasses.replace(policy, wrapped=batched)
        return batched

    def adapter(policy: Any) -> str:
        inner = own(policy)
        if not isinstance(inner, AdapterPolicy):
            raise TypeError(f"a trained node's policy must be an AdapterPolicy, got {inner!r}")
        return inner.adapter

    trained = {node: front(p, adapter(p)) for node, p in policies.trained.items()}
    return NodePolicies(trained, front(policies.base, BASE_ROW))


def node_policies(
    policy: HFPolicy, nodes: Sequence[str], *, version: str | None = None
) -> NodePolicies:
    """Return a policy per node's adapter of `policy`'s PEFT model, and its frozen base.

    `version` (default `policy.version`) prefixes each node's version: `<version>:<node>`.
    """
    prefix = version or policy.version
    trained = {n: AdapterPolicy(policy, n, version=f"{prefix}:{n}") for n in nodes}
    return NodePolicies(trained, FrozenBasePolicy(policy))


def attach_adapters(model: Any, folders: Mapping[str, str | os.PathLike[str]]) -> Any:
    """Load one adapter per node onto `model` (the mapping from node to adapter folder).

    Returns the PEFT model carrying them all on the one base, in inference mode. Each adapter
    is checked against `model`'s shapes before any is allocated (`check_adapter_fits`).

    Raises:
        ValueError: no adapters, a bad node name, or a folder with no adapter in it.
        SavedModelError: an adapter that is not a LoRA, larger than the base's shapes allow,
            or trained on a model of another size.

    """
    from peft import PeftModel

    if not folders:
        raise ValueError(
            "give at least one node's adapter folder, e.g. {'planner': 'final/planner'}"
        )
    for node, folder in folders.items():
        check_node_name(node)
        if not (Path(folder) / "adapter_config.json").is_file():
            raise ValueError(f"the {node} adapter folder {folder} holds no adapter_config.json")
        check_adapter_fits(Path(folder), model, node=node)
    (first, folder), *rest = folders.items()
    peft_model = PeftModel.from_pretrained(model, str(folder), adapter_name=first)
    for node, path in rest:
        peft_model.load_adapter(str(path), adapter_name=node)
    peft_model.eval()
    return peft_model
