"""Rollouts on a vLLM server: each step's LoRA adapter (one per trained node) pushed, then named.

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
5. Several trained nodes (`train_nodes`, one PEFT adapter per node) push an adapter each,
   named `flow-<run id>-step<k>-<node>`, and `keep` counts per node. Each node's requests name
   its own; a node that is not trained names the served base model, so it runs with every
   adapter off, as it does in the trainer's process. That name is the engine's when
   `engine_url` is the same server, else the server's own answer (`/v1/models`, the model
   with no parent), asked once before the first push; a server that cannot say is refused.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowlearn.engine.adapters import NodePolicies
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


SINGLE = "default"
"""The adapter of a planner trained alone (PEFT's default name)."""


def adapter_name(run_id: str | None, step: int, node: str | None = None) -> str:
    """Return the served name of the adapter trained for `step` steps in run `run_id`.

    `node` names one of several trained nodes' adapters: `flow-<run id>-step<k>-<node>`.
    """
    name = f"flow-{run_id or 'run'}-step{step}"
    return f"{name}-{node}" if node else name


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
    holds: dict[str, str] = field(default_factory=dict)
    """The model's adapter each pushed name holds (a node's; `keep` counts per adapter)."""

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

    def push(self, model: Any, name: str, adapter: str = SINGLE) -> Path:
        """Save `model`'s LoRA adapter `adapter` under `adapter_dir/name`, load it as `name`.

        Then unload the names of the same adapter older than the last `keep`. Returns the
        folder the server read (PEFT writes an adapter not named `default` into a subfolder
        of its name).

        Raises:
            AdapterError: the server is unreachable or refused the adapter.

        """
        saved = save_atomically(
            self.adapter_dir / name,
            lambda staging: model.save_pretrained(staging, selected_adapters=[adapter]),
        )
        folder = saved if (saved / "adapter_config.json").is_file() else saved / adapter
        self.load(name, folder.resolve())
        self.holds[name] = adapter
        same = [n for n in self.loaded if self.holds.get(n, SINGLE) == adapter]
        for old in same[: -self.keep]:
            self.unload(old)
        return folder

    def served_base(self) -> str:
        """Return the name the server serves its base model under (vLLM's `/v1/models`).

        That is the listed model without a `parent` (adapters have one); several names of one
        model (`--served-model-name a b`) give the first.

        Raises:
            AdapterError: the server is unreachable, or its listing names no single base.

        """
        status, text = self._call("GET", "/models", "list its models")
        try:
            listing = json.loads(text) if status < 400 else None
        except ValueError:
            listing = None
        cards = listing.get("data") if isinstance(listing, dict) else None
        bases = [
            c
            for c in (cards if isinstance(cards, list) else [])
            if isinstance(c, dict) and isinstance(c.get("id"), str) and not c.get("parent")
        ]
        if bases and len({c.get("root") or c["id"] for c in bases}) == 1:
            return str(bases[0]["id"])
        ids = [c["id"] for c in bases]
        said = f"HTTP {status}: {redact(text[:300])}" if status >= 400 else f"base models {ids}"
        raise AdapterError(
            f"the planner server at {redact(self.url)} does not name one base model in "
            f"/v1/models ({said}); the nodes that are not trained run on the base with every "
            "adapter off, so its served name is needed: set engine_url to planner_url and "
            "engine to the base model's served name (in Python, ServerGeneration.at(..., "
            "base=NAME))"
        )

    def load(self, name: str, folder: Path) -> None:
        """Load the adapter in `folder` under `name`; one of that name already there is replaced.

        Raises:
            AdapterError: the server is unreachable or refused it, with the likely cause.

        """
        body = {"lora_name": name, "lora_path": str(folder)}
        status, text = self._call("POST", "/load_lora_adapter", f"load {name!r}", body)
        if status == 400 and "already" in text.lower():  # left by a crashed run: reload
            logger.info("adapter %s was already on %s; loading it again", name, redact(self.url))
            self._call("POST", "/unload_lora_adapter", f"unload {name!r}", {"lora_name": name})
            status, text = self._call("POST", "/load_lora_adapter", f"load {name!r}", body)
        if status >= 400:
            raise AdapterError(refusal(self.url, name, folder, status, text))
        if name in self.loaded:
            self.loaded.remove(name)
        self.loaded.append(name)

    def unload(self, name: str) -> None:
        """Unload `name` and remove its folder; a refusal is a warning (training goes on)."""
        status, text = self._call(
            "POST", "/unload_lora_adapter", f"unload {name!r}", {"lora_name": name}
        )
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
        self.holds.pop(name, None)
        shutil.rmtree(self.adapter_dir / name, ignore_errors=True)

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    def _call(
        self, method: str, route: str, what: str, body: dict[str, str] | None = None
    ) -> tuple[int, str]:
        import httpx

        try:
            response = self._client.request(method, route, json=body)
        except httpx.HTTPError as exc:
            raise AdapterError(
                f"cannot reach the planner server at {redact(self.url)} to {what} "
                f"({type(exc).__name__}: {redact(str(exc))}); check planner_url and "
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
    """The trainer's side: push the live adapters before each step's rollouts, then use them."""

    server: AdapterServer
    base: str | None = None
    """The name the server serves the base model under, which the nodes that are not trained
    name (several trained nodes only); None: asked of the server before the first push."""
    published: int | None = None
    """The step whose adapters the server holds (None: none yet)."""
    policies: dict[str, ServerPolicy] = field(default_factory=dict)
    """The policies of the versions the server keeps loaded, by the served name they request."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    """Held while `policy_at` opens and closes policies."""

    @classmethod
    def at(
        cls, url: str, adapter_dir: str | Path, *, keep: int = 2, base: str | None = None
    ) -> ServerGeneration:
        """Build it for the vLLM server at `url`, writing adapters under `adapter_dir`.

        `base` names the server's base model, if known (see `served_base_name`).
        """
        return cls(AdapterServer(url, Path(adapter_dir), keep=keep), base=base)

    @classmethod
    def of(cls, config: Any, out: Path) -> ServerGeneration | None:
        """Return the server a `FlowGRPOConfig` names (`planner_url`), or None without one.

        Adapters go under `adapter_dir` (default `out/adapters`). With several trained nodes,
        the nodes not trained name the served base: the engine's name when `engine_url` is
        the same server, else the server's own answer (`served_base_name`).
        """
        if not getattr(config, "planner_url", None):
            return None
        base = served_base_name(config.planner_url, config.engine_url, config.engine)
        return cls.at(config.planner_url, config.adapter_dir or out / "adapters", base=base)

    def current(self, trainer: Any, node: str | None = None, version: int | None = None) -> str:
        """Return the name of the adapter holding the trainer's weights (`node`'s).

        Now, or after `version` updates.
        """
        run_id = getattr(trainer.source, "run_id", None)
        step = trainer.state.global_step if version is None else version
        return adapter_name(run_id, step, node)

    def names(self, trainer: Any, version: int | None = None) -> dict[str, str]:
        """Return the served name of each adapter of the trainer's model, by adapter name.

        The planner trained alone: PEFT's `default` adapter; several trained nodes
        (`trainer.roles`): one adapter per node, named after it. `version`: the names after
        that many updates (default: now).
        """
        roles = getattr(trainer, "roles", None)
        if roles is None:
            return {SINGLE: self.current(trainer, version=version)}
        return {node: self.current(trainer, node, version) for node in roles.nodes}

    def live_policy(self, trainer: Any, model: Any) -> ServerPolicy | NodePolicies:
        """Return the policy of this step's rollouts, pushing the adapters it names first.

        The planner trained alone: a `ServerPolicy` naming this step's adapter. Several
        trained nodes: a `NodePolicies` of one `ServerPolicy` per node, each naming its node's
        adapter, over a base `ServerPolicy` naming the served base model (every adapter off).

        Args:
            trainer: the `FlowGRPOTrainer` (its step, run id, roles, tokenizer and processes).
            model: its unwrapped model, a PeftModel.

        Raises:
            ValueError: a model without a LoRA adapter.
            AdapterError: the server could not take an adapter, or (several nodes) does not
                say which base model it serves (on every process).

        """
        if not hasattr(model, "peft_config"):
            raise ValueError(
                "planner_url pushes LoRA adapters to the server, but the model has none: "
                "train with lora on, or for full fine-tuning generate with TRL's vLLM path "
                "(use_vllm with vllm_mode server or colocate)"
            )
        version = int(trainer.state.global_step)
        self.publish_at(trainer, model, version)
        return self.policy_at(trainer, version, model.get_input_embeddings().num_embeddings)

    def publish_at(self, trainer: Any, model: Any, version: int) -> None:
        """Push the adapters of `model` as they are after `version` updates (once a version).

        Raises:
            AdapterError: the server could not take an adapter (on every process).

        """
        if self.published != version:
            several = getattr(trainer, "roles", None) is not None
            self._publish(trainer, model, self.names(trainer, version), base=several)
            self.published = version

    def policy_at(self, trainer: Any, version: int, vocab_size: int) -> ServerPolicy | NodePolicies:
        """Return the policy sampling under the adapters of `version`, pushed before.

        It pushes nothing: the asynchronous producer samples with it while the trainer pushes
        newer ones.
        """
        names = self.names(trainer, version)
        several = getattr(trainer, "roles", None) is not None
        wanted = [*names.values(), *([str(self.base)] if several else [])]
        with self.lock:  # the producer's thread and an evaluation on the trainer's
            return self._policy_at(trainer, version, vocab_size, names, wanted, several)

    def _policy_at(
        self,
        trainer: Any,
        version: int,
        vocab_size: int,
        names: dict[str, str],
        wanted: list[str],
        several: bool,
    ) -> ServerPolicy | NodePolicies:
        # Close only the versions the server no longer keeps loaded: a newer call (an
        # evaluation's) must not close the policies an older one's rollouts still use.
        kept = {
            name
            for back in range(self.server.keep)
            for name in self.names(trainer, version - back).values()
        }
        for stale in [n for n in self.policies if n not in kept and n != str(self.base)]:
            self.policies.pop(stale).close()
        for name in wanted:
            if name not in self.policies:
                self.policies[name] = ServerPolicy(
                    self.server.url,
                    name,
                    tokenizer=trainer.processing_class,
                    vocab_size=vocab_size,
                    api_key_env=self.server.api_key_env,
                    timeout_s=self.server.timeout_s,
                    version=name if name != self.base else None,  # the base: `<name>@server`
                )
        if not several:
            return self.policies[names[SINGLE]]
        trained = {node: self.policies[name] for node, name in names.items()}
        return NodePolicies(trained, self.policies[str(self.base)])

    def correct(self, trainer: Any, rows: list[FlowGRPORow]) -> None:
        """Importance-correct the rows an older adapter sampled (each node's), and count them."""
        names = self.names(trainer)
        current = names if getattr(trainer, "roles", None) is not None else names[SINGLE]
        correct_stale_rows(trainer, rows, current)

    def _publish(self, trainer: Any, model: Any, names: dict[str, str], *, base: bool) -> None:
        """Push on the main process; every process gets its outcome (an error raises on all).

        With `base`, the served base's name is learnt first (`served_base`) unless given, so a
        server that cannot say is refused before anything is loaded.
        """
        from accelerate.utils import broadcast_object_list

        box: list[str | None] = [None, self.base]
        error: BaseException | None = None
        if trainer.accelerator.is_main_process:
            try:
                if base and box[1] is None:
                    box[1] = self.server.served_base()
                for adapter, name in names.items():
                    self.server.push(model, name, adapter)
            except Exception as exc:  # every process must hear of it, or the others hang
                box[0], error = f"{type(exc).__name__}: {exc}", exc
        broadcast_object_list(box)
        if error is not None:
            raise error
        if box[0] is not None:
            pushed = ", ".join(repr(n) for n in names.values())
            raise AdapterError(f"the main process could not push adapters {pushed}: {box[0]}")
        self.base = box[1]


def served_base_name(planner_url: str, engine_url: str | None, engine: str | None) -> str | None:
    """Return the served base's name a config gives: the engine's, on the planner's server.

    With `engine_url` the same server as `planner_url`, `engine` is the name it serves its base
    model under (the adapters' base); otherwise None, to be asked of the server.
    """
    if engine_url is None or engine_url.rstrip("/") != planner_url.rstrip("/"):
        return None
    return engine
