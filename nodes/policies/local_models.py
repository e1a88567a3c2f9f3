"""Build the local planner policy and fixed engine from model names (the caller resolves them)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from flowlearn.nodes.policies.batching import BatchingPolicy
from flowlearn.nodes.policies.hf import HFPolicy
from flowlearn.nodes.policies.hf_chat import HFChatModel
from flowlearn.nodes.policies.loading import untrained_twin
from flowlearn.nodes.prompts import Budgets


@dataclass
class LocalModels:
    """The planner policy and the fixed engine; one backend when both name the same model."""

    planner: HFPolicy | BatchingPolicy
    engine: HFChatModel


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
    """Load the planner and the engine by name.

    Args:
        planner: "default" (the embedded SmolLM2-135M-Instruct), a hub id, a folder or a .gguf.
        engine: the engine's model; None: the planner's (for the default planner, the embedded
            model without its trained adapter: `default-base`). When both name the same source
            they share one model in memory.
        device: "cpu", "cuda", ...; None picks CUDA when available.
        dtype: a torch dtype name; None picks bf16 on CUDA and fp32 on CPU.
        engine_max_new_tokens: the engine's token budget for every call; None: each role's
            own (`Prompts.budgets`: the executor's, verifier's, generator's, ...).
        engine_budget: the budget of an engine call that names none (the tools' calls).
        batch_size: above 1, concurrent calls (from concurrent rollouts or eval cases) are
            decoded together by a `BatchingPolicy` of that size.
        cache_dir: where the converted default model is kept (see `loading.cache_dir`).

    """
    engine_source = engine or untrained_twin(planner)  # the default engine is never trained

    def load(source: str) -> HFPolicy:
        return HFPolicy.from_pretrained(source, device=device, dtype=dtype, cache_dir=cache_dir)

    policy = load(planner)
    backend = policy if engine_source == planner else load(engine_source)
    planner_policy: HFPolicy | BatchingPolicy = policy
    engine_policy: HFPolicy | BatchingPolicy = backend
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
