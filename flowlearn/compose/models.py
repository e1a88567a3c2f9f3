"""Load the flow's models by name: local ones, and ones on an OpenAI-compatible server (vLLM)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flowlearn.compose.names import FlowSpec, check_model_name
from flowlearn.engine import (
    BASE_SOURCE,
    BatchingPolicy,
    HFChatModel,
    HFPolicy,
    LocalPolicy,
    ModelNotFoundError,
    Policy,
    ServerChatModel,
    ServerPolicy,
    untrained_twin,
)
from flowlearn.engine.adapters import NodePolicies, attach_adapters, mixed_batching, node_policies
from flowlearn.engine.saved_adapters import read_adapters_record
from flowlearn.errors import UsageError
from flowlearn.nodes.prompts import (
    Budgets,
    Prompts,
)

if TYPE_CHECKING:
    pass


def load_parts(
    spec: FlowSpec, prompts: Prompts | None = None
) -> tuple[Policy | NodePolicies, HFChatModel]:
    """Load the planner and the engine: local, or on their servers (`planner_url`, `engine_url`).

    A local planner and a local engine of the same model share one copy in memory; with the
    planner on a server the local model is the engine's; with both served nothing loads here.
    A training result of several nodes (`engine.saved_adapters.ADAPTERS_RECORD`) loads as the
    `NodePolicies` of its adapters on their one base.
    """
    engine: HFChatModel | None = None
    budget = (prompts or spec.prompt_set()).budgets.engine
    if spec.engine_url is not None:
        engine = server_engine(
            spec.engine_url,
            spec.engine,
            fixed_max_new_tokens=spec.engine_max_new_tokens,
            max_new_tokens=budget,
        )
        if spec.planner_url is not None:
            return server_planner(spec.planner_url, spec.planner), engine
    local = (spec.engine or BASE_SOURCE) if spec.planner_url else spec.planner
    models = load_local_models(
        local,
        None if engine is not None else spec.engine,
        device=spec.device,
        dtype=spec.dtype,
        engine_max_new_tokens=spec.engine_max_new_tokens,
        engine_budget=budget,
        batch_size=spec.batch_size,
        cache_dir=spec.cache_dir,
    )
    if spec.planner_url is not None:
        return server_planner(spec.planner_url, spec.planner), models.engine
    return models.nodes or models.planner, engine or models.engine


def load_chat_model(name: str, spec: FlowSpec, *, max_new_tokens: int = 256) -> HFChatModel:
    """Load a local model as a chat model (an LLM judge, say), on the spec's device and cache.

    Raises:
        UsageError: a model that cannot be found, with how to fix it.

    """
    check_model_name(name)
    try:
        policy = HFPolicy.from_pretrained(
            name, device=spec.device, dtype=spec.dtype, cache_dir=spec.cache_dir
        )
    except ModelNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    return HFChatModel(policy=policy, max_new_tokens=max_new_tokens)


@dataclass
class LocalModels:
    """The planner policy and the fixed engine; one backend when both name the same model."""

    planner: LocalPolicy
    """An `HFPolicy`, a `BatchingPolicy` over one, or its node's front of a mixed-adapter batch."""
    engine: HFChatModel
    nodes: NodePolicies | None = None
    """A training result of several nodes: each node's adapter policy, and the base."""


def load_local_models(
    planner: str = "default",
    engine: str | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    engine_max_new_tokens: int | None = None,
    engine_budget: int = Budgets().engine,
    batch_size: int = 1,
    cache_dir: str | os.PathLike[str] | None = None,
) -> LocalModels:
    """Load the planner and the engine by name ("default", a hub id, a folder or a .gguf).

    An unset `engine` is the planner's model untrained (`default-base` for the default); two
    of the same source share one copy in memory. `engine_max_new_tokens` is every engine
    call's budget (None: each role's own), `engine_budget` that of a call that names none.
    Above 1, `batch_size` decodes concurrent calls together (`BatchingPolicy`).
    """
    engine_source = engine or untrained_twin(planner)  # the default engine is never trained

    def load(source: str) -> HFPolicy:
        return HFPolicy.from_pretrained(source, device=device, dtype=dtype, cache_dir=cache_dir)

    try:
        record = read_adapters_record(planner)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if record is not None:
        return node_models(
            record, planner, engine_source, load, engine_max_new_tokens, engine_budget, batch_size
        )
    policy = load(planner)
    backend = policy if engine_source == planner else load(engine_source)
    planner_policy: LocalPolicy = policy
    engine_policy: LocalPolicy = backend
    if batch_size > 1:
        planner_policy = BatchingPolicy(policy, max_batch_size=batch_size)
        shared = backend is policy
        engine_policy = (
            planner_policy if shared else BatchingPolicy(backend, max_batch_size=batch_size)
        )
    return LocalModels(
        planner=planner_policy,
        engine=HFChatModel(
            policy=engine_policy,
            max_new_tokens=engine_budget,
            fixed_max_new_tokens=engine_max_new_tokens,
        ),
    )


def node_models(
    record: tuple[str, dict[str, Any]],
    folder: str,
    engine_source: str,
    load: Any,
    engine_max_new_tokens: int | None,
    engine_budget: int,
    batch_size: int,
) -> LocalModels:
    """Load a training result of several nodes: its base once, each node's adapter on it.

    The planner plans with its adapter (the base's, when it was not trained); an engine that
    is the base (what the nodes were trained against, unless named otherwise) runs on that same
    copy with every adapter off. Above 1, `batch_size` decodes every node's calls and the base
    engine's in one batch of mixed adapters (`mixed_batching`), as training's rollouts do.
    """
    base, folders = record
    loaded = load(base)
    model = attach_adapters(loaded.model, folders)
    name = os.path.basename(os.path.normpath(folder))
    nodes = node_policies(HFPolicy(model, loaded.tokenizer), list(folders), version=name)
    on_base = engine_source in (base, folder)
    if batch_size > 1:  # every node's calls and the base's in one batch of mixed adapters
        nodes = mixed_batching(nodes, batch_size)
    engine_policy: LocalPolicy = nodes.base
    if not on_base:
        own: HFPolicy = load(engine_source)
        batching = BatchingPolicy(own, max_batch_size=batch_size) if batch_size > 1 else None
        engine_policy = batching or own
    planner = nodes.for_node("planner")
    return LocalModels(
        planner=planner,
        engine=HFChatModel(
            policy=engine_policy,
            max_new_tokens=engine_budget,
            fixed_max_new_tokens=engine_max_new_tokens,
        ),
        nodes=nodes,
    )


class ServedNameError(UsageError):
    """A served model whose name cannot be used here; the message says what to give."""


def served_tokenizer(name: str) -> Any:
    """Load the tokenizer of the served model `name`, or return None when none loads here."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError):
        return None


def server_planner(url: str, model: str) -> ServerPolicy:
    """Return the planner served at `url` as `model`; prompts render here if its tokenizer loads."""
    return ServerPolicy(url, model, tokenizer=served_tokenizer(model))


def server_engine(
    url: str,
    model: str | None,
    *,
    fixed_max_new_tokens: int | None = None,
    max_new_tokens: int = Budgets().engine,
) -> ServerChatModel:
    """Return the fixed engine on the server at `url`, serving `model`.

    Raises:
        ServedNameError: no model named, or one whose tokenizer does not load here.

    """
    if not model or model in {"default", "base"}:
        raise ServedNameError(
            f"--engine-url needs --engine: the name the server at {url} serves the engine "
            f"model under (got {model!r}); serve a local folder (vllm serve /models/X) and "
            "give that path, so its tokenizer loads here too"
        )
    tokenizer = served_tokenizer(model)
    if tokenizer is None:
        raise ServedNameError(
            f"the engine {model!r} on {url}: its tokenizer does not load here, and the engine's "
            "prompts are rendered here (its chat template, the tool-call prefill); serve the "
            "model from a local folder and name that folder with --engine"
        )
    policy = ServerPolicy(url, model, tokenizer=tokenizer)
    return ServerChatModel(
        policy=policy, max_new_tokens=max_new_tokens, fixed_max_new_tokens=fixed_max_new_tokens
    )
