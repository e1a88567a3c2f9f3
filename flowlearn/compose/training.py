"""A training job's parts from a `FlowGRPOConfig`'s names: planner, engine, tools and data.

Training's modules load torch and TRL, so only the functions that build a job import them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from flowlearn.compose.flows import build_tools, load_work
from flowlearn.compose.models import server_engine
from flowlearn.compose.names import FlowSpec, check_names
from flowlearn.engine import (
    HFChatModel,
    ModelHandle,
    ModelNotFoundError,
    untrained_twin,
)
from flowlearn.errors import UsageError
from flowlearn.graphs.agentflow import TRAINABLE_NODES
from flowlearn.nodes.prompts import Prompts

if TYPE_CHECKING:
    from flowlearn.training.config import FlowGRPOConfig
    from flowlearn.training.run import TrainingParts


def training_spec(config: FlowGRPOConfig) -> FlowSpec:
    """Name the job's planner, engine and tools from the config alone (plus cache folders).

    An unset engine is resolved as `flowlearn run` resolves it (`FlowSpec.engine_choice`): a
    planner that `flowlearn train` wrote trains on against the engine it was trained against.
    """
    env = FlowSpec.from_env()
    spec = FlowSpec(
        planner=config.planner or "default",
        engine=None if config.engine == "base" else config.engine,
        engine_max_new_tokens=config.engine_max_new_tokens,
        corpus=config.corpus,
        prompts=config.prompts,
        cache_dir=env.cache_dir,
        benchmarks_dir=env.benchmarks_dir,
    )
    if config.engine == "base" or config.engine_url is not None:
        return spec
    return dataclasses.replace(spec, engine=spec.engine_choice()[0])


def build_training_parts(config: FlowGRPOConfig) -> TrainingParts:
    """Check every name, then load the planner (LoRA-wrapped when asked), engine, tools, data.

    LoRA wraps the planner here, so the frozen base can serve as the engine (`engine: base`).
    Raises `UsageError`: a bad name, or a model that cannot be found, with how to fix it.
    """
    from flowlearn.training.from_trl import trainable_planner
    from flowlearn.training.model import load_planner
    from flowlearn.training.run import TrainingParts
    from flowlearn.training.vllm.settings import require_vllm

    try:
        config.check_questions_named()
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    spec = training_spec(config)
    check_names(spec, tools=config.tools, benchmark=config.benchmark, data=config.data)
    check_trainable_nodes(config.train_nodes)
    try:
        require_vllm(config)  # use_vllm: vLLM is there, before any model loads
        data = None
        if not config.trajectories:  # a data file with no scorer is scored by exact match
            scorer = config.scorer or (None if config.benchmark else "exact_match")
            _, cases, score, _ = load_work(
                spec,
                benchmark=config.benchmark,
                data=config.data,
                scorer=scorer,
                limit=config.limit,
            )
            context = config.context()
            for case in cases:  # a question the rollouts would refuse: before any model loads
                try:
                    context.check_question(case.query)
                except ValueError as exc:
                    raise ValueError(f"case {case.id!r}: {exc}") from None
            data = (cases, score)
        device = "cpu" if config.use_cpu else None  # None: CUDA when available
        model, tokenizer, lora = load_planner(config, spec.planner, spec.cache_dir, device)
    except (ValueError, ModelNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    model = trainable_planner(model, config, lora)
    handle = ModelHandle(model, tokenizer)  # the live planner and the frozen base share its lock
    parts = TrainingParts(model=model, tokenizer=tokenizer, lora=lora, handle=handle)
    parts.prompts = spec.prompt_set()
    parts.engine_name = engine_source(config, spec)  # recorded in final/, to be served again
    parts.base_name = spec.planner
    if data is None:
        return parts
    parts.engine = training_engine(config, spec, handle, device, parts.prompts)
    parts.tools = build_tools(spec, parts.engine, parts.prompts)
    parts.cases, parts.scorer = data
    return parts


def check_trainable_nodes(nodes: list[str]) -> None:
    """Refuse a trained node the AgentFlow graph cannot give a policy of its own.

    Raises:
        UsageError: naming the node and the ones that can be trained.

    """
    other = [n for n in nodes if n not in TRAINABLE_NODES]
    if other:
        raise UsageError(
            f"train_nodes {other}: the AgentFlow graph trains {list(TRAINABLE_NODES)}; "
            "the generator runs the fixed engine. To train another node, build "
            "your own graph (FlowGRPOTrainer's graph_factory) whose node calls the policy"
        )


def engine_source(config: FlowGRPOConfig, spec: FlowSpec) -> str | None:
    """Name the local model the rollouts' engine is (None: served at `engine_url`).

    `engine: base` is the planner's own weights with the trained adapter off.
    """
    if config.engine_url is not None:
        return None
    return spec.planner if config.engine == "base" else spec.engine or untrained_twin(spec.planner)


def training_engine(
    config: FlowGRPOConfig,
    spec: FlowSpec,
    handle: ModelHandle,
    device: str | None,
    prompts: Prompts,
) -> HFChatModel:
    """Return the rollouts' fixed engine: on `engine_url`, the frozen base, or its own model.

    Raises:
        UsageError: a served engine whose tokenizer does not load here, an engine that cannot
            be found, or `engine: base` on a planner without adapters.

    """
    if config.engine_url is not None:  # the server batches the concurrent rollouts' calls
        return server_engine(
            config.engine_url,
            config.engine,
            fixed_max_new_tokens=config.engine_max_new_tokens,
            max_new_tokens=prompts.budgets.engine,
        )
    from flowlearn.training.from_trl import local_engine

    source = engine_source(config, spec)
    try:
        return local_engine(config, source, handle, device, prompts, cache_dir=spec.cache_dir)
    except (ValueError, ModelNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
