"""Planner rollouts on a vLLM server: each step's LoRA adapter pushed over HTTP, then named.

Why it looks like this:
1. vLLM serves LoRA adapters beside its base model and loads new ones at run time
   (`POST /v1/load_lora_adapter` with `{"lora_name", "lora_path"}`, on a server started with
   `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`). So the weights being trained
   reach the server as a small adapter folder, never as a full weight sync: before the
   rollouts of step k the trainer saves its adapter to `adapter_dir/<name>`, loads it under a
   fresh name, and the rollouts name it as the `model` of their completions requests. Step
   k+1 thus samples from the weights after update k, and the name is every planner
   transition's `policy_version`.
2. The server opens the folder by its path: `adapter_dir` must be the same path on the
   trainer's machine and the server's (one machine, or a shared filesystem).
3. A name is a function of the run id and the step (`flow-<run id>-step<k>`), so every
   process knows the current one without asking, and a resumed run names the adapters of its
   checkpoint's steps again (one a crashed run left loaded under that name is reloaded).
4. Only the main process saves and loads; the others wait for the outcome, and an error
   reaches every process, so none waits forever. The current adapter and the one before it
   stay loaded (`keep`); older ones are unloaded and their folders removed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowlearn.engine.server import ServerPolicy
from flowlearn.errors import AdapterError
from flowlearn.files import save_atomically
from flowlearn.secrets import redact, remember, url_secrets
from flowlearn.training.rows import FlowGRPORow
from flowlearn.training.vllm.correction import correct_stale_rows

logger = logging.getLogger(__name__)

START_HINT = (
    "start it as `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve BASE --enable-lora "
    "--max-lora-rank R --logprobs-mode processed_logprobs`"
)


def adapter_name(run_id: str | None, step: int) -> str:
    """Return the served name of the adapter trained for `step` steps in run `run_id`."""
    return f"flow-{run_id or 'run'}-step{step}"


@dataclass
class AdapterServer:
    """The runtime-LoRA endpoints of one vLLM server: load, unload, and what this run loaded."""

    url: str
    """The server's OpenAI base URL, e.g. `http://127.0.0.1:8000/v1`."""
    adapter_dir: Path
    """Where adapters are written; the server must see it at the same path."""
    keep: int = 2
    """Adapters left loaded: the current one and the one before it."""
    api_key_env: str | None = "OPENAI_API_KEY"
    """The variable holding the server's key (vLLM `--api-key`), sent as a bearer token."""
    timeout_s: float = 300.0
    """Seconds one request may take (a load reads the folder and may allocate a slot)."""
    loaded: list[str] = field(default_factory=list)
    """The names this run loaded and has not unloaded, oldest first."""

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"planner_url must start with http:// or https://, got {self.url!r}")
        if self.keep < 1:
            raise ValueError(f"keep must be >= 1 (the current adapter), got {self.keep}")
        import httpx

        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        remember(key, *url_secrets(self.url))  # a 401 body may echo it
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.url = self.url.rstrip("/")
        self._client = httpx.Client(base_url=self.url, headers=headers, timeout=self.timeout_s)

    def push(self, model: Any, name: str) -> Path:
        """Save `model`'s LoRA adapter as `adapter_dir/name`, load it as `name`, drop old ones.

        Raises:
            AdapterError: the server is unreachable or refused the adapter.

        """
        folder = save_atomically(
            self.adapter_dir / name,
            lambda staging: model.save_pretrained(staging, selected_adapters=["default"]),
        )
        self.load(name, folder.resolve())
        for old in self.loaded[: -self.keep]:
            self.unload(old)
        return folder

    def load(self, name: str, folder: Path) -> None:
        """Load the adapter in `folder` under `name`; one of that name already there is replaced.

        Raises:
            AdapterError: the server is unreachable or refused it, with the likely cause.

        """
        body = {"lora_name": name, "lora_path": str(folder)}
        status, text = self._post("/load_lora_adapter", body, name)
        if status == 400 and "already" in text.lower():  # left by a crashed run: reload
            logger.info("adapter %s was already on %s; loading it again", name, redact(self.url))
            self._post("/unload_lora_adapter", {"lora_name": name}, name)
            status, text = self._post("/load_lora_adapter", body, name)
        if status >= 400:
            raise AdapterError(refusal(self.url, name, folder, status, text))
        if name in self.loaded:
            self.loaded.remove(name)
        self.loaded.append(name)

    def unload(self, name: str) -> None:
        """Unload `name` and remove its folder; a refusal is a warning (training goes on)."""
        status, text = self._post("/unload_lora_adapter", {"lora_name": name}, name)
        if status >= 400:
            logger.warning(
                "the planner server at %s did not unload adapter %s (HTTP %d: %s); it keeps "
                "its memory until the server restarts",
                redact(self.url),
                name,
                status,
                redact(text[:300]),
            )
        self.loaded.remove(name)
        shutil.rmtree(self.adapter_dir / name, ignore_errors=True)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def _post(self, route: str, body: dict[str, str], name: str) -> tuple[int, str]:
        import httpx

        try:
            response = self._client.post(route, json=body)
        except httpx.HTTPError as exc:
            raise AdapterError(
                f"cannot reach the planner server at {redact(self.url)} to {route.strip('/')} "
                f"{name!r} ({type(exc).__name__}: {redact(str(exc))}); check planner_url and "
                f"that the server is up: {START_HINT}"
            ) from None
        return response.status_code, response.text


def refusal(url: str, name: str, folder: Path, status: int, text: str) -> str:
    """Say why a server refused to load an adapter, and what to change."""
    said = redact(text[:500])
    head = (
        f"the planner server at {redact(url)} refused to load LoRA adapter {name!r} from "
        f"{folder} (HTTP {status}: {said})"
    )
    if status == 404 and _route_missing(text):
        return f"{head}: it has no runtime LoRA endpoints; {START_HINT}"
    if status in (401, 403):
        return f"{head}: put the server's --api-key in OPENAI_API_KEY"
    return (
        f"{head}. The server opens the folder by its path, so adapter_dir must be the same "
        "path on the server's machine (one machine or a shared filesystem); the adapter's "
        "rank must be at most the server's --max-lora-rank, and its base the served model"
    )


def _route_missing(text: str) -> bool:
    """Say whether a 404 body is the web framework's (no such route), not vLLM's own error."""
    try:
        return bool(json.loads(text) == {"detail": "Not Found"})
    except ValueError:
        return False


@dataclass
class ServerGeneration:
    """The trainer's side: push the live adapter before each step's rollouts, then plan on it."""

    server: AdapterServer
    published: int | None = None
    """The step whose adapter the server holds (None: none yet)."""
    policy: ServerPolicy | None = None
    """The planner of the current step's rollouts."""

    @classmethod
    def at(cls, url: str, adapter_dir: str | Path, *, keep: int = 2) -> ServerGeneration:
        """Build it for the vLLM server at `url`, writing adapters under `adapter_dir`."""
        return cls(AdapterServer(url, Path(adapter_dir), keep=keep))

    def current(self, trainer: Any) -> str:
        """Return the name of the adapter that holds the trainer's weights now."""
        return adapter_name(getattr(trainer.source, "run_id", None), trainer.state.global_step)

    def live_policy(self, trainer: Any, model: Any) -> ServerPolicy:
        """Return the planner for this step's rollouts, pushing the adapter it names first.

        Args:
            trainer: the `FlowGRPOTrainer` (its step, run id, tokenizer and processes).
            model: its unwrapped model, a PeftModel.

        Raises:
            ValueError: a model without a LoRA adapter.
            AdapterError: the server could not take the adapter (on every process).

        """
        if not hasattr(model, "peft_config"):
            raise ValueError(
                "planner_url pushes LoRA adapters to the server, but the model has none: "
                "train with lora on, or for full fine-tuning generate with TRL's vLLM path "
                "(use_vllm with vllm_mode server or colocate)"
            )
        name = self.current(trainer)
        if self.published != trainer.state.global_step:
            self._publish(trainer, model, name)
            self.published = trainer.state.global_step
        if self.policy is None or self.policy.model != name:
            if self.policy is not None:
                self.policy.close()
            self.policy = ServerPolicy(
                self.server.url,
                name,
                tokenizer=trainer.processing_class,
                api_key_env=self.server.api_key_env,
                timeout_s=self.server.timeout_s,
                version=name,
            )
        return self.policy

    def correct(self, trainer: Any, rows: list[FlowGRPORow]) -> None:
        """Importance-correct the rows an older adapter sampled, and count them."""
        correct_stale_rows(trainer, rows, self.current(trainer))

    def _publish(self, trainer: Any, model: Any, name: str) -> None:
        """Push on the main process; every process gets its outcome (an error raises on all)."""
        from accelerate.utils import broadcast_object_list

        box: list[str | None] = [None]
        error: BaseException | None = None
        if trainer.accelerator.is_main_process:
            try:
                self.server.push(model, name)
            except Exception as exc:  # every process must hear of it, or the others hang
                box[0], error = f"{type(exc).__name__}: {exc}", exc
        broadcast_object_list(box)
        if error is not None:
            raise error
        if box[0] is not None:
            raise AdapterError(f"the main process could not push adapter {name!r}: {box[0]}")
