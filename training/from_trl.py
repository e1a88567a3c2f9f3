"""TRL's constructor shape: a model name, reward functions and a dataset become a flow to train.

`FlowGRPOTrainer(model="Qwen/...", reward_funcs=[...], args=FlowGRPOConfig(...),
train_dataset=dataset)` reads as TRL's `GRPOTrainer` call. This module translates those into
the composition root's inputs and asks the root (`flowlearn.compose.training`) for the flow's
parts, as `flowlearn train`, `flowlearn run` and Studio do:

1. The names: the model as given (its name, or a loaded model's `name_or_path`) and `args`
   become the root's `FlowSpec` (`training_spec`), checked before any model loads (tools,
   models, corpus, web key, sandbox, trained nodes: `check_training_names`).
2. The model: a hub id, a folder, a .gguf file or `default`/`default-base` loads as the
   planner (LoRA-wrapped when `args.lora` says so, or above 1B parameters); a loaded model is
   taken as it is, with `processing_class` or its own tokenizer.
3. The fixed engine, tools and prompt set, each unless given (`flow_parts`): `args.engine`
   (a name, or `base`: the frozen base under LoRA) or `engine_url`, else the engine a trained
   folder records, else a frozen copy of the planner's untrained model; the default tools
   over it (`args.tools`, `web`, `python_isolation`); `args.prompts`, else the set a trained
   folder records, else `smollm2` beside the embedded model, else AgentFlow's.
4. The output folder is claimed as `flowlearn train` claims it: one of other files is refused.
5. The questions: the dataset's rows (`rewards.dataset_cases`); the outcome: the reward
   functions' weighted sum (`rewards.RewardFunctions`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from trl.trainer.grpo_config import GRPOConfig

from flowlearn.compose.training import check_training_names, flow_parts, training_spec
from flowlearn.engine import (
    BatchingPolicy,
    FrozenBasePolicy,
    HFChatModel,
    HFPolicy,
    ModelHandle,
)
from flowlearn.engine.protocol import Policy
from flowlearn.nodes.prompts import Prompts
from flowlearn.outputs import claim_folder
from flowlearn.training.config import FlowGRPOConfig
from flowlearn.training.model import load_planner, with_lora
from flowlearn.training.rewards import RewardFunc, RewardFunctions, dataset_cases
from flowlearn.training.roles import lora_settings, several_roles, with_node_adapters
from flowlearn.training.rollouts import (
    Replay,
    Rollouts,
    agentflow_factory,
    format_penalty,
    step_concurrency,
)
from flowlearn.training.vllm.lora_server import ServerGeneration


@dataclass
class TRLParts:
    """What the TRL-shaped call resolves to: the model, its tokenizer and the rollout source."""

    model: Any
    tokenizer: Any
    source: Rollouts
    handle: ModelHandle
    prompts: Prompts | None
    """The AgentFlow graph's prompt set, recorded in a saved final/; None: the caller's own
    graph (`graph_factory`), whose prompts are its own."""
    outcome: RewardFunctions
    engine_name: str | None
    """The local model the engine is (None: a given engine), recorded in a saved final/."""
    base_name: str | None = None
    """The model as named (the base of every node's adapter), recorded in a saved final/."""
    server: ServerGeneration | None = None
    """Where a graph of yours samples (`planner_url`, each node's adapter pushed); None: here."""
    tools: list[BaseTool] = field(default_factory=list)
    """The AgentFlow graph's tools, as the composition root bound them; empty: your graph's."""


def resolve_source(
    model: Any,
    reward_funcs: Any,
    args: Any,
    train_dataset: Any,
    source: Rollouts | Replay | None,
    trainer_kwargs: dict[str, Any],
    **parts: Any,
) -> tuple[Any, GRPOConfig, Rollouts | Replay, TRLParts | None]:
    """Return the model, config, source and (TRL's shape) parts a `FlowGRPOTrainer` trains.

    With no `source`, the call is TRL's shape: the parts are built (`trl_shape`) and the
    tokenizer goes into `trainer_kwargs` as `processing_class`.

    Raises:
        ValueError: as `trl_shape`, or parts given beside a ready source.

    """
    if source is not None:
        refuse_parts_beside_source(
            args, reward_funcs=reward_funcs, train_dataset=train_dataset, **parts
        )
        refuse_init_kwargs_beside_loaded(model, args, by_name=False)
        return model, cast(GRPOConfig, args), source, None
    processing_class = trainer_kwargs.pop("processing_class", None)
    args, built = trl_shape(
        model, reward_funcs, args, train_dataset, processing_class=processing_class, **parts
    )
    trainer_kwargs["processing_class"] = built.tokenizer
    return built.model, args, built.source, built


def refuse_init_kwargs_beside_loaded(model: Any, args: Any, *, by_name: bool = True) -> None:
    """Refuse `args.model_init_kwargs` beside a model object (TRL would only log it ignores them).

    `by_name`: whether this shape of the trainer could load the model by name instead (TRL's
    shape can; `online` and `offline` take a loaded model only).

    Raises:
        ValueError: `model` is loaded already and `args.model_init_kwargs` is set.

    """
    if not isinstance(model, str) and getattr(args, "model_init_kwargs", None):
        fix = (
            "pass its name as model=, or load it with those keywords yourself"
            if by_name
            else "load it with those keywords yourself (from_pretrained(name, **keywords)) "
            "and drop args.model_init_kwargs"
        )
        raise ValueError(
            "args.model_init_kwargs apply when the trainer loads the model by name; this model "
            f"is loaded already: {fix}"
        )


def trl_shape(
    model: Any,
    reward_funcs: RewardFunc | str | Sequence[RewardFunc | str] | None,
    args: Any,
    train_dataset: Iterable[Mapping[str, Any]] | None,
    **parts: Any,
) -> tuple[FlowGRPOConfig, TRLParts]:
    """Return the config (default `FlowGRPOConfig()`) and the parts of a TRL-shaped call.

    Raises:
        ValueError: as `trl_parts`, and a config naming its own questions (benchmark, data)
            beside `train_dataset`.

    """
    args = args if args is not None else FlowGRPOConfig()
    if isinstance(args, FlowGRPOConfig) and (args.benchmark or args.data):
        raise ValueError(
            "args names a benchmark or data file and train_dataset is given; the questions "
            "come from one of them: drop benchmark/data from args"
        )
    return args, trl_parts(model, reward_funcs, args, train_dataset, **parts)


def refuse_parts_beside_source(args: Any, **parts: Any) -> None:
    """Refuse TRL-shaped parts given with a ready source, and a source without args.

    Raises:
        ValueError: naming the parts given.

    """
    given = [name for name, value in parts.items() if value is not None]
    if given:
        raise ValueError(
            f"a source takes args and no {', '.join(given)}: its graph and rewards are built "
            "already; give reward_funcs and train_dataset without a source for TRL's shape"
        )
    if args is None:
        raise ValueError("args is required with a source")


def trl_parts(
    model: Any,
    reward_funcs: RewardFunc | str | Sequence[RewardFunc | str] | None,
    args: FlowGRPOConfig,
    train_dataset: Iterable[Mapping[str, Any]] | None,
    *,
    processing_class: Any = None,
    engine: BaseChatModel | None = None,
    tools: Sequence[BaseTool] | None = None,
    prompts: Prompts | None = None,
    graph_factory: Callable[[Policy], Any] | None = None,
) -> TRLParts:
    """Build the planner, engine, tools and questions of a TRL-shaped `FlowGRPOTrainer` call.

    Raises:
        ValueError: a missing dataset or reward function, a config that is not a
            `FlowGRPOConfig`, names that contradict each other; a name the composition root
            refuses (`UsageError`: a tool, model, corpus, web key or sandbox, as `flowlearn
            train` refuses it).

    """
    given = any(p is not None for p in (engine, tools, prompts))
    refuse_contradictions(args, graph_factory, parts_given=given)
    if train_dataset is None:
        raise ValueError("train_dataset is required: the questions (and answers) to train on")
    if reward_funcs is None:
        raise ValueError("reward_funcs is required: the functions that score each rollout")
    outcome = RewardFunctions.of(reward_funcs, args.reward_weights)
    source_name = _model_name(model, args)
    spec = None
    if graph_factory is None:  # the root's names, checked before anything loads
        _refuse_nameless_engine(source_name, args, given=engine is not None)
        spec = training_spec(args, planner=source_name or "")
        check_training_names(args, spec, planner_loaded=not isinstance(model, str))
    # the folder belongs to this run, as under `flowlearn train`: a folder of other files is
    # refused before anything loads or is written (`flowlearn.outputs`)
    claim_folder(Path(str(args.output_dir)), "train", flag="output_dir", adopt=("run.json",))
    cases = dataset_cases(train_dataset)
    device = "cpu" if args.use_cpu else None  # None: CUDA when available
    refuse_init_kwargs_beside_loaded(model, args)
    if isinstance(model, str):
        model, loaded, lora = load_planner(args, model, None, device)
        processing_class = processing_class or loaded
        model = trainable_planner(model, args, lora)
    if processing_class is None:
        from transformers import AutoTokenizer

        processing_class = AutoTokenizer.from_pretrained(model.name_or_path)
    handle = ModelHandle(model, processing_class)
    engine_name: str | None = None
    bound: list[BaseTool] = []
    if graph_factory is None:  # the AgentFlow graph, on the root's parts
        assert spec is not None  # named and checked above, before anything loaded
        flow = flow_parts(args, spec, handle, device, engine=engine, tools=tools, prompts=prompts)
        prompts, engine_name, bound = flow.prompts, flow.engine_name, flow.tools
        graph_factory = agentflow_factory(flow.engine, bound, prompts)
    source = Rollouts(
        graph_factory,
        outcome,
        cases,
        extra_rewards={"format_penalty": format_penalty(args.format_penalty, args.train_nodes)}
        if args.format_penalty
        else None,
        concurrency=args.rollout_concurrency,
        reward_errors=args.reward_errors,
    )
    server = ServerGeneration.of(args, Path(str(args.output_dir)))  # your graph, not AgentFlow's
    return TRLParts(
        model,
        processing_class,
        source,
        handle,
        prompts,
        outcome,
        engine_name,
        source_name,
        server,
        tools=bound,
    )


def refuse_contradictions(args: Any, graph_factory: Any, *, parts_given: bool) -> None:
    """Refuse a TRL-shaped call whose config or parts exclude each other.

    Raises:
        ValueError: `args` no `FlowGRPOConfig`; `planner_url` with the AgentFlow graph; a
            `graph_factory` beside an engine, tools or prompts.

    """
    if not isinstance(args, FlowGRPOConfig):
        raise ValueError(
            f"args is a {type(args).__name__}; FlowGRPOTrainer takes a FlowGRPOConfig (TRL's "
            "GRPOConfig with the flow's settings: max_turns, questions_per_step, lora, ...)"
        )
    if args.planner_url is not None and graph_factory is None:
        raise ValueError(
            "planner_url: TRL's shape samples the AgentFlow graph locally; to sample it on a "
            "vLLM server, train with `flowlearn train --planner_url ...`, or build the trainer "
            "with FlowGRPOTrainer.online(..., server=ServerGeneration.at(url, adapter_dir)). A "
            "graph_factory of your own (trainable_graph) samples on the server"
        )
    if graph_factory is not None and parts_given:
        raise ValueError(
            "give graph_factory or engine, tools and prompts, not both: the factory builds "
            "the whole graph, its prompts included"
        )


def _model_name(model: Any, args: FlowGRPOConfig) -> str | None:
    name = model if isinstance(model, str) else getattr(model, "name_or_path", None)
    if isinstance(model, str) and args.planner and args.planner != model:
        raise ValueError(
            f"model={model!r} and args.planner={args.planner!r} name two planners; give one"
        )
    return str(name) if name else None


def _refuse_nameless_engine(planner: str | None, args: FlowGRPOConfig, *, given: bool) -> None:
    """Refuse a loaded model with no name when nothing else names the fixed engine."""
    if planner or given or args.engine or args.engine_url is not None:
        return
    raise ValueError(
        "the model has no name_or_path to load the fixed engine from; pass engine= or set "
        "args.engine"
    )


def trainable_planner(model: Any, args: FlowGRPOConfig, lora: bool) -> Any:
    """Return the loaded planner as it trains: an adapter per trained node, one LoRA, or as is.

    The adapters wrap it here, so the frozen base can serve as the engine (`engine: base`).
    """
    if several_roles(args.train_nodes):  # an adapter per trained node, on one base
        return with_node_adapters(model, {node: lora_settings(args) for node in args.train_nodes})
    return with_lora(model, args) if lora else model


def local_engine(
    args: FlowGRPOConfig,
    name: str | None,
    handle: ModelHandle,
    device: str | None,
    prompts: Prompts,
    cache_dir: str | None = None,
) -> HFChatModel:
    """Return the rollouts' local fixed engine: the frozen base (`engine: base`) or `name`.

    The rollouts' engine calls are concurrent too: they decode together (`BatchingPolicy`),
    as many at once as a step has rollouts.

    Raises:
        ValueError: `engine: base` on a model with no adapter to turn off.

    """
    if args.engine == "base":
        from peft import PeftModel

        if not isinstance(handle.model, PeftModel):
            raise ValueError("engine 'base' is the frozen base under LoRA; it needs lora on")
        backend: HFPolicy = FrozenBasePolicy(HFPolicy.on(handle))
    else:
        backend = HFPolicy.from_pretrained(name, device=device, cache_dir=cache_dir)
    batch = step_concurrency(
        args.rollout_concurrency, args.questions_per_step, int(args.num_generations or 1)
    )
    return HFChatModel(
        policy=BatchingPolicy(backend, max_batch_size=batch),
        max_new_tokens=prompts.budgets.engine,
        fixed_max_new_tokens=args.engine_max_new_tokens,
    )
