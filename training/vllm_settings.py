"""Which `use_vllm` settings Flow-GRPO training can honour; the others are errors that say why.

Checked twice: by `FlowGRPOConfig` when a config is parsed (with the flow's fields: planner,
LoRA, offline data), and by the trainer for any `GRPOConfig` (`trl_vllm.attach_vllm`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

LORA_PATH = (
    "use_vllm trains full weights through TRL's sync_weights; for LoRA use the server path "
    "(planner_url: the adapter is pushed to a vLLM server with /v1/load_lora_adapter)"
)
"""Where LoRA training with vLLM goes instead."""

ENGINE_FIELDS = (
    "vllm_mode",
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout",
    "vllm_group_port",
    "vllm_tensor_parallel_size",
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "vllm_enable_sleep_mode",
    "vllm_model_impl",
    "vllm_structured_outputs_regex",
)
"""TRL's settings of the `use_vllm` engine: set without `use_vllm`, they would do nothing."""


def check_vllm_engine(args: Any) -> None:
    """Refuse engine settings under which a rank's generate would need the other ranks.

    Raises:
        ValueError: an unknown `vllm_mode`, tensor parallelism in colocate mode, sleep mode,
            or sampling whose vLLM logprobs are not the distribution the trainer scores.

    """
    if args.vllm_mode not in ("colocate", "server"):
        raise ValueError(f"vllm_mode must be 'colocate' or 'server', got {args.vllm_mode!r}")
    if args.vllm_mode == "colocate" and args.vllm_tensor_parallel_size != 1:
        raise ValueError(
            f"vllm_tensor_parallel_size={args.vllm_tensor_parallel_size} in colocate mode: "
            "TRL's generate then all-gathers the prompts of its TP group in every call, and "
            "flows on different ranks make different numbers of calls (a deadlock); use 1, or "
            "vllm_mode server with a tensor-parallel server"
        )
    if args.vllm_enable_sleep_mode:
        raise ValueError(
            "vllm_enable_sleep_mode: the flow calls generate many times per step, and after "
            "each call TRL would drop vLLM's weights, then gather and reload them in the next "
            "(a collective inside generate); turn it off"
        )
    if args.top_p < 1 or (args.top_k or 0) > 0 or (args.min_p or 0) > 0:
        raise ValueError(
            f"use_vllm with top_p={args.top_p}, top_k={args.top_k}, min_p={args.min_p}: vLLM's "
            "processed logprobs are renormalised over the truncated distribution, the trainer "
            "scores the full one; sample with top_p 1 (top_k 0, min_p unset)"
        )


def check_vllm_config(config: Any) -> None:
    """Check a `FlowGRPOConfig`'s vLLM settings; under `use_vllm` an unset `lora` means off.

    Raises:
        ValueError: an engine setting without `use_vllm`, or `use_vllm` with settings it
            contradicts (offline data, a GGUF or default planner, LoRA, engine 'base').

    """
    if not config.use_vllm:
        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        for name in ENGINE_FIELDS:
            if getattr(config, name) != defaults[name]:
                raise ValueError(
                    f"{name}={getattr(config, name)!r} has no effect without use_vllm: set "
                    "use_vllm true, or leave it out"
                )
        return
    check_vllm_engine(config)
    if config.trajectories:
        raise ValueError("use_vllm generates rollouts; offline training (trajectories) has none")
    planner = str(config.planner or "default")
    if planner == "default" or planner.endswith(".gguf"):
        raise ValueError(
            f"use_vllm with planner {planner!r}: vLLM loads the planner by name, and a .gguf "
            "file (the default planner is one) is not a model folder; give a model folder or "
            "hub id, e.g. the default converted once by flowlearn: "
            "~/.cache/flowlearn/SmolLM2-135M-Instruct"
        )
    if config.lora:
        raise ValueError(f"use_vllm with lora: {LORA_PATH}")
    config.lora = False  # full fine-tuning, whatever the model's size
    if config.engine == "base":
        raise ValueError(
            "engine 'base' is the frozen base under LoRA, and use_vllm trains full weights; "
            "name the engine's model (or leave it unset for a frozen copy of the planner)"
        )


def require_vllm(config: Any) -> None:
    """Fail before any model loads when `use_vllm` is on and vLLM is not installed.

    Raises:
        ValueError: vLLM cannot be imported.

    """
    from trl.import_utils import is_vllm_available

    if config.use_vllm and not is_vllm_available():
        raise ValueError(
            "use_vllm needs vLLM on this machine (pip install 'trl[vllm]', TRL 1.16 supports "
            "vLLM 0.22 to 0.31); or turn use_vllm off to generate with transformers"
        )
