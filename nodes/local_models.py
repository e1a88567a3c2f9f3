"""Build the local planner policy and fixed engine from names, environment variables or defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass

from flowlearn.nodes.hf_chat import HFChatModel
from flowlearn.nodes.hf_policy import HFPolicy

PLANNER_ENV = "FLOWLEARN_PLANNER"
ENGINE_ENV = "FLOWLEARN_ENGINE"


@dataclass
class LocalModels:
    """The planner policy and the fixed engine; one backend when both name the same model."""

    planner: HFPolicy
    engine: HFChatModel


def load_local_models(
    planner: str | None = None,
    engine: str | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    engine_max_new_tokens: int = 384,
    batch_size: int = 1,
) -> LocalModels:
    """Load the planner and engine, from arguments, else `$FLOWLEARN_PLANNER` / `$FLOWLEARN_ENGINE`.

    Unnamed models are the embedded SmolLM2-135M-Instruct. When both resolve to the same source,
    they share one model in memory. With `batch_size` > 1, concurrent calls (from concurrent
    rollouts or eval cases) are decoded together by a `BatchingPolicy` of that size.
    """
    planner_source = planner or os.environ.get(PLANNER_ENV) or "default"
    engine_source = engine or os.environ.get(ENGINE_ENV) or planner_source
    policy = HFPolicy.from_pretrained(planner_source, device=device, dtype=dtype)
    backend = (
        policy
        if engine_source == planner_source
        else HFPolicy.from_pretrained(engine_source, device=device, dtype=dtype)
    )
    if batch_size > 1:
        from flowlearn.nodes.batching import BatchingPolicy

        shared = backend is policy
        policy = BatchingPolicy(policy, max_batch_size=batch_size)
        backend = policy if shared else BatchingPolicy(backend, max_batch_size=batch_size)
    return LocalModels(
        planner=policy, engine=HFChatModel(policy=backend, max_new_tokens=engine_max_new_tokens)
    )
