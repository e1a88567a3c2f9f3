"""The planner a training step's rollouts sample from, and what a step without rows says."""

from __future__ import annotations

import logging
from typing import Any

from flowlearn.nodes.policies.handle import ModelHandle
from flowlearn.nodes.policies.hf import HFPolicy
from flowlearn.nodes.policies.protocol import Policy

logger = logging.getLogger("flowlearn.training.trainer")


def live_policy(trainer: Any, model: Any) -> Policy:
    """Return the step's planner: the live model, versioned `output_dir@step`.

    It samples locally on the trainer's handle (shared with the frozen base), on a vLLM server
    under this step's LoRA adapter (`trainer.server`), or on TRL's vLLM engine
    (`trainer.vllm`).
    """
    if trainer.model_handle is None or trainer.model_handle.model is not model:
        trainer.model_handle = ModelHandle(model, trainer.processing_class)
    version = f"{trainer.args.output_dir}@{trainer.state.global_step}"
    if trainer.server is not None:  # on the server, under this step's adapter
        return trainer.server.live_policy(trainer, model)  # type: ignore[no-any-return]
    if trainer.vllm is not None:  # TRL's vLLM engine, weights synced each step
        return trainer.vllm.policy(trainer, version)  # type: ignore[no-any-return]
    return HFPolicy.on(trainer.model_handle, version=version)


def warn_no_rows(step: int, rollouts: int) -> None:
    """Say that this process has no rows this step (the update is skipped if no process has)."""
    logger.warning(
        "step %d: this process has no rows to train on (%d rollouts, all dropped or "
        "without policy turns); an update no process has rows for is skipped",
        step,
        rollouts,
    )
