"""The composition root's training half: a `FlowGRPOConfig`'s names in, a training job's parts out.

Training goes through the same checks as the CLI and Studio (`flowlearn.compose.check_names`):
a typo in `tools`, `benchmark`, `corpus` or a model name fails before any model loads, instead
of every rollout failing. Only names in the config count: the `FLOWLEARN_*` variables that pick
models and tools for `run` and Studio never change what trains (the cache and benchmarks folders
still come from the environment, as everywhere).
"""

from __future__ import annotations

from typing import Any

from flowlearn.compose import FlowSpec, UsageError, build_tools, check_names
from flowlearn.nodes.policies import (
    BatchingPolicy,
    FrozenBasePolicy,
    HFChatModel,
    HFPolicy,
    ModelHandle,
    ModelNotFoundError,
    load_model_and_tokenizer,
    untrained_twin,
)
from flowlearn.nodes.policies.loading import parameter_count, pick_device_and_dtype
from flowlearn.served_models import ServedNameError, server_engine
from flowlearn.training.config import FlowGRPOConfig
from flowlearn.training.rollouts import ROLLOUT_CONCURRENCY
from flowlearn.training.run import TrainingParts, cases_and_scorer
from flowlearn.training.vllm.settings import require_vllm


def training_spec(config: FlowGRPOConfig) -> FlowSpec:
    """Name the job's planner, engine and tools from the config alone (plus cache folders)."""
    env = FlowSpec.from_env()
    return FlowSpec(
        planner=config.planner or "default",
        engine=None if config.engine == "base" else config.engine,
        engine_max_new_tokens=config.engine_max_new_tokens,
        corpus=config.corpus,
        prompts=config.prompts,
        cache_dir=env.cache_dir,
        benchmarks_dir=env.benchmarks_dir,
    )


def build_training_parts(config: FlowGRPOConfig) -> TrainingParts:
    """Check every name, then load the planner (LoRA-wrapped when asked), engine, tools, data.

    LoRA wraps the planner here, so the frozen base can serve as the engine (`engine: base`);
    TRL then sees a PeftModel.

    Raises:
        UsageError: a bad name, or a model that cannot be found, with how to fix it.

    """
    spec = training_spec(config)
    check_names(spec, tools=config.tools, benchmark=config.benchmark, data=config.data)
    try:
        require_vllm(config)  # use_vllm: vLLM is there, before any model loads
        data = None if config.trajectories else cases_and_scorer(config, spec.benchmarks_dir)
        device = "cpu" if config.use_cpu else None  # None: CUDA when available
        model, tokenizer, lora = load_planner(config, spec, device)
    except (ValueError, ModelNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    if lora:
        model = with_lora(model, config)
    handle = ModelHandle(model, tokenizer)  # the live planner and the frozen base share its lock
    parts = TrainingParts(model=model, tokenizer=tokenizer, lora=lora, handle=handle)
    if data is None:
        return parts
    parts.prompts = spec.prompt_set()
    parts.engine = training_engine(config, spec, handle, device)
    parts.tools = build_tools(spec, parts.engine, parts.prompts)
    parts.cases, parts.scorer = data
    return parts


def training_engine(
    config: FlowGRPOConfig, spec: FlowSpec, handle: ModelHandle, device: str | None
) -> HFChatModel:
    """Return the rollouts' fixed engine: on `engine_url`, the frozen base, or its own model.

    Raises:
        UsageError: a served engine whose tokenizer does not load here.

    """
    if config.engine_url is not None:  # the server batches the concurrent rollouts' calls
        try:
            return server_engine(
                config.engine_url,
                config.engine,
                fixed_max_new_tokens=config.engine_max_new_tokens,
                max_new_tokens=spec.prompt_set().budgets.engine,
            )
        except ServedNameError as exc:
            raise UsageError(str(exc)) from exc
    if config.engine == "base":
        backend: HFPolicy = FrozenBasePolicy(HFPolicy.on(handle))
    else:
        backend = HFPolicy.from_pretrained(
            spec.engine or untrained_twin(spec.planner), device=device, cache_dir=spec.cache_dir
        )
    return HFChatModel(
        # the rollouts' engine calls are concurrent too: decoded together, not one by one
        policy=BatchingPolicy(backend, max_batch_size=ROLLOUT_CONCURRENCY),
        max_new_tokens=spec.prompt_set().budgets.engine,
        fixed_max_new_tokens=config.engine_max_new_tokens,
    )


def load_planner(
    config: FlowGRPOConfig, spec: FlowSpec, device: str | None
) -> tuple[Any, Any, bool]:
    """Load the planner in the precision its training wants; return it, its tokenizer, `lora`.

    Full fine-tuning loads fp32: the master weights come straight from the checkpoint, and
    `bf16` makes the compute bf16 under autocast. Under LoRA the frozen base loads as for
    inference (bf16 on CUDA) and PEFT keeps the adapter fp32. `lora` unset means on above 1B
    parameters, counted from the config before loading; a GGUF file (whose header costs
    about as much to read as a load) loads fp32 first and, under LoRA, casts its base down.
    """
    lora = config.lora
    if lora is None and not str(spec.planner).endswith(".gguf"):
        lora = parameter_count(spec.planner, spec.cache_dir) > 1e9
    model, tokenizer = load_model_and_tokenizer(
        spec.planner, device=device, dtype=None if lora else "float32", cache_dir=spec.cache_dir
    )
    if lora is None:
        lora = model.num_parameters() > 1e9
        if lora:
            model.to(pick_device_and_dtype(device, None)[1])
    return model, tokenizer, bool(lora)


def with_lora(model: Any, config: FlowGRPOConfig) -> Any:
    """Wrap `model` in a LoRA adapter on all linear layers (peft)."""
    from peft import LoraConfig, get_peft_model

    adapter = LoraConfig(
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, adapter)
