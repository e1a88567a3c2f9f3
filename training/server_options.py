"""Checks of the settings of planner generation on a vLLM server with LoRA pushed over HTTP.

`planner_url` asks for it; `adapter_dir` goes with it; TRL's `vllm_importance_sampling_*`
settings weigh the rows an older adapter sampled (`flowlearn.training.stale_rows`). What
cannot work together is an error here, when the config is built, not a failed first step.
"""

from __future__ import annotations

from typing import Any

from flowlearn.training.stale_rows import IS_MODES

FULL_FINE_TUNING = (
    "for full fine-tuning with vLLM generation use TRL's own path (use_vllm with vllm_mode "
    "server or colocate), which syncs all weights"
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
