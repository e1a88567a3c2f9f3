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
   PEFT's `save_pretrained` writes named adapters), the tokenizer, and `ADAPTERS_RECORD`
   naming the base model, so `flowlearn run --planner FOLDER` rebuilds it with one base copy.
5. The record names the base so that it resolves from any folder (an absolute path, or a hub
   id) with its fingerprint (`base_fingerprint`), and loading checks it: a base named as typed
   ("tinyrel") resolved against the loading folder, and a same-shaped model put where the base
   was, would load another model under the adapters without a word. Each adapter is checked
   against the base's shapes before PEFT allocates it (`loading.check_adapter_fits`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.loading import (
    BASE_SOURCE,
    DEFAULT_SOURCES,
    check_adapter_fits,
    read_json_record,
)
from flowlearn.engine.local import FrozenBasePolicy, HFPolicy, trainability_kept, tuned_parts
from flowlearn.engine.protocol import continues_prefill
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.stops import StopWatch
from flowlearn.engine.tokens import BASE_ROW, ModelHandle
from flowlearn.errors import SavedModelError, brief

logger = logging.getLogger(__name__)

ADAPTERS_RECORD = "flowlearn_adapters.json"
"""The file in a training result of several nodes that names its base model and its nodes."""
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


def mixed_batching(policies: NodePolicies, max_batch_size: int) -> NodePolicies:
    """Return `policies` decoding together: one batch of mixed adapters for every node.

    Each trained node's `AdapterPolicy` (inside a `NodeSampling`, if any) and the base become
    `AdapterBatching` fronts of one `BatchingPolicy` on their shared handle.
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


WEIGHT_SAMPLES = 64
"""Evenly spaced reads per weight file in a base's fingerprint."""
SAMPLE_BYTES = 4096
VOLATILE_CONFIG_KEYS = frozenset({"transformers_version", "_name_or_path", "name_or_path"})
"""Keys of a model's config.json that saving it again may change; left out of its hash."""


def embedded(base: str) -> bool:
    """Whether `base` names flowlearn's embedded default model (resolvable anywhere)."""
    return base.lower() in (*DEFAULT_SOURCES, BASE_SOURCE)


def locate_base(base: str, kind: str | None = None) -> tuple[Path | None, str | None]:
    """Return where the model `base` is on this machine and its hub revision, or (None, None).

    A path (a folder or a .gguf file) is made absolute; a hub id is found in the local hub
    cache only (its snapshot folder, whose name is the commit). `kind` "hub" skips the path.
    """
    path = Path(base).expanduser()
    if kind != "hub" and path.exists():
        return path.resolve(), None
    if kind in ("folder", "file") or path.is_absolute() or base.startswith((".", "~")):
        return None, None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(base, "config.json")
    except (ImportError, ValueError):  # an id the hub would refuse
        return None, None
    if not isinstance(found, str):
        return None, None
    return Path(found).parent, Path(found).parent.name


def base_fingerprint(where: Path, revision: str | None = None) -> dict[str, Any]:
    """Fingerprint the model at `where`: its config's hash, vocabulary size and sampled weights.

    The weights are sampled (`WEIGHT_SAMPLES` reads of `SAMPLE_BYTES` spread over each weight
    file, with its name and size), so the fingerprint costs milliseconds for any size of model,
    yet tells apart two models of the same shape: any two trainings differ all over their
    weights. `revision` is the hub commit, when the model came from the hub's cache.
    """
    config: Any = {}
    files = [where]
    if where.is_dir():
        if (where / "config.json").is_file():
            config = read_json_record(where / "config.json", "model config")
        files = sorted(p for p in where.iterdir() if weight_file(p.name))
    config = config if isinstance(config, dict) else {}
    kept = {k: v for k, v in config.items() if k not in VOLATILE_CONFIG_KEYS}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}\n".encode())
        with open(file, "rb") as handle:
            for k in range(WEIGHT_SAMPLES):
                handle.seek(size * k // WEIGHT_SAMPLES)
                digest.update(handle.read(SAMPLE_BYTES))
    return {
        "config_sha256": hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()
        if where.is_dir()
        else None,
        "vocab_size": config.get("vocab_size") or text.get("vocab_size"),
        "weights_sample_sha256": digest.hexdigest(),
        "revision": revision,
    }


def weight_file(name: str) -> bool:
    """Whether a file of a model folder holds its weights (safetensors, or torch's .bin)."""
    return name.endswith(".safetensors") or (
        name.startswith("pytorch_model") and name.endswith(".bin")
    )


FINGERPRINT_PARTS = {
    "vocab_size": "vocab",
    "config_sha256": "config.json sha256",
    "weights_sample_sha256": "weights sample sha256",
    "revision": "revision",
}


def describe_fingerprint(fingerprint: Mapping[str, Any]) -> str:
    """Say a fingerprint in words: `vocab 400, config.json sha256 1a2b3c4d5e6f, ...`."""
    parts = []
    for key, words in FINGERPRINT_PARTS.items():
        value = fingerprint.get(key)
        if value is not None:
            parts.append(f"{words} {str(value)[:12] if key != 'vocab_size' else value}")
    return ", ".join(parts) or "no fingerprint"


def write_adapters_record(folder: Path, base: str, nodes: Sequence[str]) -> None:
    """Name, in a training result's `folder`, its base model and its nodes' adapters.

    The base is recorded where it resolves from any folder (an absolute path, a hub id, or the
    embedded default's name), with its kind and fingerprint (`base_fingerprint`), or a null
    fingerprint where the base cannot be found here (a hub id not in the local cache).
    """
    located, revision = (None, None) if embedded(base) else locate_base(base)
    kind = "embedded" if embedded(base) else "hub"
    if located is not None and revision is None:
        kind, base = ("folder" if located.is_dir() else "file"), str(located)
    record = {
        "base": base,
        "base_kind": kind,
        "base_fingerprint": None if located is None else base_fingerprint(located, revision),
        "nodes": list(nodes),
    }
    (folder / ADAPTERS_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")


def read_adapters_record(folder: str | os.PathLike[str]) -> tuple[str, dict[str, Path]] | None:
    """Return the base model and each node's adapter folder of a training result, or None.

    None when `folder` is not a result of several nodes (no `ADAPTERS_RECORD`). The base is
    checked against its recorded fingerprint (`checked_base`).

    Raises:
        ValueError: a record that is not one (too large, too deep, not JSON), a node whose
            adapter folder is missing, or a base that is gone or not the model the adapters
            were trained on (`SavedModelError`, a ValueError).

    """
    root = Path(folder).expanduser()
    path = root / ADAPTERS_RECORD
    if not path.is_file():
        return None
    record = read_json_record(path, "record of trained adapters")
    base = record.get("base") if isinstance(record, dict) else None
    nodes = record.get("nodes") if isinstance(record, dict) else None
    if not isinstance(base, str) or not base or not isinstance(nodes, list) or not nodes:
        raise SavedModelError(f"{path} does not name a base and nodes; fix or remove it")
    folders = {check_node_name(node): root / node for node in nodes}
    if len(folders) != len(nodes):  # a dict would keep one of each silently
        twice = [n for n, k in Counter(nodes).items() if k > 1]
        raise SavedModelError(f"{path} names nodes twice: {brief(twice)}; fix or remove it")
    missing = [n for n, f in folders.items() if not (f / "adapter_config.json").is_file()]
    if missing:
        raise ValueError(f"{root} names adapters {brief(missing)} that are not there; incomplete")
    return checked_base(record, path), folders


def checked_base(record: Mapping[str, Any], path: Path) -> str:
    """Return the record's base after checking it is the model the adapters were trained on.

    A record an older flowlearn wrote has no fingerprint and names the base as typed: one
    relative to the folder training ran in is refused when such a path exists here (it may
    well be another model: the case this check exists for); any other loads with a warning.

    Raises:
        SavedModelError: a folder or file base that is gone, a base whose fingerprint differs
            (saying what differs), or an older record's relative base.

    """
    base, kind = record["base"], record.get("base_kind")
    if embedded(base):
        return str(base)
    fix = f'or edit "base" in {path} to where that model is now (it is checked again)'
    if "base_fingerprint" not in record:  # written by an older flowlearn
        return older_base(base, path)
    recorded = record["base_fingerprint"]
    if kind == "hub" and Path(base).expanduser().exists():
        raise SavedModelError(
            f"{path} names the hub model {base}, and a folder {base} here would load instead; "
            "run from another folder"
        )
    located, revision = locate_base(base, kind)
    if located is None and kind != "hub":
        raise SavedModelError(
            f"the base model {base} that the adapters in {path.parent} were trained on is not "
            "there any more (deleted, as a temporary folder is, or the result was copied from "
            f"another machine); put that model back at {base}, {fix}"
        )
    if located is None or not isinstance(recorded, dict):
        logger.warning(
            "%s: its base %s could not be checked (%s); loading it as named",
            path,
            base,
            "no fingerprint was recorded" if located else "not in the local hub cache",
        )
        return str(base)
    current = base_fingerprint(located, revision)
    differs = [
        FINGERPRINT_PARTS[k]
        for k in FINGERPRINT_PARTS
        if recorded.get(k) is not None and recorded.get(k) != current.get(k)
    ]
    if differs:
        raise SavedModelError(
            f"the adapters in {path.parent} were trained on base {base} "
            f"({describe_fingerprint(recorded)}); {located} now has "
            f"{describe_fingerprint(current)}: another model ({', '.join(differs)} "
            f"{'differs' if len(differs) == 1 else 'differ'}). Put the model they were trained "
            f"on back at {base}, {fix}"
        )
    return str(base)


def older_base(base: str, path: Path) -> str:
    """Return an older record's base (no fingerprint), or refuse an ambiguous relative one.

    Raises:
        SavedModelError: a relative path that exists here, or an absolute one that is gone.

    """
    here = Path(base).expanduser()
    fix = (
        f'edit "base" in {path} to the absolute path (or hub id) of the model the adapters '
        "were trained on"
    )
    if here.is_absolute() and not here.exists():
        raise SavedModelError(f"the base model {base} named in {path} is not there any more; {fix}")
    if not here.is_absolute() and here.exists():
        raise SavedModelError(
            f"{path} (written by an older flowlearn) names its base as typed, {base!r}, relative "
            f"to the folder training ran in and without a fingerprint: from here it would load "
            f"{here.resolve()}, which may be another model; {fix}"
        )
    logger.warning(
        "%s was written by an older flowlearn: its base %s has no fingerprint to check it by. "
        'If it is a folder, edit "base" there to its absolute path',
        path,
        base,
    )
    return base
