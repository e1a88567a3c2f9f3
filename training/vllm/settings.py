"""Which vLLM settings Flow-GRPO training can honour; the others are errors that say why.

Two ways to generate on vLLM, each checked when a config is built, not in a failed first step:
1. `use_vllm`: TRL's own vLLM generation, full fine-tuning (`trl_engine`). Checked twice: by
   `FlowGRPOConfig` when a config is parsed (with the flow's fields: planner, LoRA, offline
   data), and by the trainer for any `GRPOConfig` (`trl_engine.attach_vllm`).
2. `planner_url`: your vLLM server, each step's LoRA adapter pushed to it over HTTP
   (`lora_server`); `adapter_dir` goes with it, and TRL's `vllm_importance_sampling_*` settings
   weigh the rows an older adapter sampled (`correction`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""TRL's `vllm_importance_sampling_mode` values."""

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

FULL_FINE_TUNING = (
    "for full fine-tuning with vLLM generation use TRL's own path (use_vllm with vllm_mode "
    "server or colocate), which syncs all weights"
)


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


def check_server_options(config: Any) -> None:
    """Refuse contradictory server-generation settings; turn LoRA on when left unset.

    Raises:
        ValueError: the contradiction, named, with what to change.

    """
    check_engine_url(config)
    url = config.planner_url
    if url is None:
        if config.adapter_dir is not None:
            raise ValueError(
                "adapter_dir is where adapters for the planner_url server go; without "
                "planner_url nothing is written there: set planner_url or drop adapter_dir"
            )
        return
    check_online_url("planner_url", url, config, "samples online rollouts")
    if config.lora is False:
        raise ValueError(
            "planner_url trains a LoRA adapter and loads it into the server after every step; "
            f"it needs lora on (leave lora unset or true). {FULL_FINE_TUNING}"
        )
    if getattr(config, "use_vllm", False):
        raise ValueError(
            "planner_url (your vLLM server, LoRA adapters pushed to it) and use_vllm (TRL's "
            "vLLM generation) are two ways to generate: give one"
        )
    if config.top_p < 1:
        raise ValueError(
            f"planner_url with top_p {config.top_p}: the server's processed logprobs are "
            "renormalised over the top-p nucleus, while the trainer scores the full "
            "distribution, so every row would be refused; set top_p 1"
        )
    mode = config.vllm_importance_sampling_mode
    if mode not in IS_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {IS_MODES}, got {mode!r}")
    config.lora = True


def check_engine_url(config: Any) -> None:
    """Refuse an `engine_url` that cannot serve the rollouts' fixed engine.

    Raises:
        ValueError: a non-http URL, offline training, or no served model named.

    """
    url = config.engine_url
    if url is None:
        return
    check_online_url("engine_url", url, config, "runs the engine of online rollouts")
    if config.engine in (None, "", "base", "default"):
        raise ValueError(
            f"engine_url needs engine: the name the server serves the engine model under, a "
            f"local folder it was started on (got {config.engine!r}; 'base' is the frozen base "
            "in this process, not a served model)"
        )


def check_online_url(name: str, url: object, config: Any, does: str) -> None:
    """Refuse a server URL option that is not http(s), or that offline training gives.

    Raises:
        ValueError: naming the option `name`, what it `does`, and the fix.

    """
    if not str(url).startswith(("http://", "https://")):
        raise ValueError(
            f"{name} must be the server's OpenAI base URL, http(s)://HOST:PORT/v1, got {url!r}"
        )
    if config.trajectories:
        raise ValueError(
            f"{name} {does}; offline training (trajectories) has none: drop one of them"
        )
