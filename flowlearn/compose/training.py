"""A training job's parts from a `FlowGRPOConfig`'s names: planner, engine, tools and data.

`flowlearn train` and TRL's shape (`FlowGRPOTrainer(model=..., args=FlowGRPOConfig(...))`,
`training.from_trl`) both ask `flow_parts` for the rollouts' engine, tools and prompt set,
from the `FlowSpec` that `training_spec` names: the names and builders `flowlearn run` and
Studio use. Training's modules load torch and TRL, so only the functions that build a job
import them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

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


def training_spec(config: FlowGRPOConfig, planner: str | None = None) -> FlowSpec:
    """Name the job's planner, engine and tools from the config alone (plus cache folders).

    `planner`: the model TRL's shape was given, by name or loaded ("" for a loaded model with
    no name); None: `config.planner`. An unset engine is resolved as `flowlearn run` resolves
    it (`FlowSpec.engine_choice`): a planner that `flowlearn train` wrote trains on against
    the engine it was trained against.
    """
    env = FlowSpec.from_env()
    spec = FlowSpec(
        planner=(config.planner or "default") if planner is None else planner,
        engine=None if config.engine == "base" else config.engine,
        engine_max_new_tokens=config.engine_max_new_tokens,
        corpus=config.corpus,
        web=config.web,
        wikipedia_endpoint=config.wikipedia_endpoint,
        python_isolation=config.python_isolation,
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
    check_training_names(config, spec)
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
    flow = flow_parts(config, spec, handle, device, prompts=parts.prompts)
    parts.engine, parts.tools = flow.engine, flow.tools
    parts.cases, parts.scorer = data
    return parts


def check_training_names(
    config: FlowGRPOConfig, spec: FlowSpec, *, planner_loaded: bool = False
) -> None:
    """Check every name of a training job before any model loads, as `flowlearn run` does.

    The tools, models, corpus, benchmark and data file (`check_names`), and the trained nodes.
    `planner_loaded`: TRL's shape was given a model object, whose name is not checked.

    Raises:
        UsageError: the first bad name, with the choices or the fix.

    """
    check_names(
        spec,
        tools=config.tools,
        benchmark=config.benchmark,
        data=config.data,
        planner_loaded=planner_loaded,
    )
    check_trainable_nodes(config.train_nodes)


@dataclass
class FlowParts:
    """The rollouts' fixed engine, tools and prompt set, as the composition root builds them."""

    engine: BaseChatModel
    tools: list[BaseTool]
    prompts: Prompts
    engine_name: str | None
    """The local model the engine is, recorded in a saved final/ (None: served, or given)."""


def flow_parts(
    config: FlowGRPOConfig,
    spec: FlowSpec,
    handle: ModelHandle,
    device: str | None,
    *,
    engine: BaseChatModel | None = None,
    tools: Sequence[BaseTool] | None = None,
    prompts: Prompts | None = None,
) -> FlowParts:
    """Return the rollouts' engine, tools and prompt set: each one given, else the spec's.

    The prompt set is `spec.prompt_set()`, the engine `training_engine`'s and the tools
    `build_tools`' (web tools and the python tool's sandbox as the config names them): what
    `flowlearn run` builds from the same names.

    Raises:
        UsageError: as `training_engine`.

    """
    prompts = prompts or spec.prompt_set()
    name = engine_source(config, spec) if engine is None else None
    engine = engine or training_engine(config, spec, handle, device, prompts)
    bound = list(tools) if tools is not None else build_tools(spec, engine, prompts)
    return FlowParts(engine, bound, prompts, name)


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
    if config.engine == "base":
        return spec.planner or None
    return spec.engine or untrained_twin(spec.planner)


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
