"""A training result back in your app: a chat model per trained node, loaded here or on vLLM.

Why it looks like this:
1. The app is run with the chat model it was trained with (`TrainableChatModel`): LangGraph
   names the calling node in every call, so one model handed to your builder runs each
   trained node's calls on that node's LoRA adapter and every other node's on the base, as in
   training (same chat rendering, same redaction). Nothing of your app changes.
2. Loaded here, the base loads once and every node's adapter sits on it (PEFT named adapters),
   switched per call: the same loading as `flowlearn run --planner FOLDER`
   (`load_local_models`), with its fingerprint check of the base.
3. Served, vLLM holds the base once and an adapter per node (`--enable-lora --lora-modules
   node=path`): `serve_command` derives that command from the result, and a load with
   `server_url` names each node's adapter in that node's requests (`ServerPolicy`, prompts
   rendered here with the model's tokenizer and sent as token ids), the base's name in the
   others'. Nothing but the tokenizer loads here.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flowlearn.compose.models import load_local_models
from flowlearn.engine.adapters import NodePolicies
from flowlearn.engine.loading import read_json_record
from flowlearn.engine.saved_adapters import embedded, read_adapters_record
from flowlearn.engine.server import ServerPolicy
from flowlearn.errors import SavedModelError, UsageError
from flowlearn.graphs.trainable import TrainableChatModel

__all__ = ["LORA_RANKS", "TrainedApp", "TrainedResult", "load_trained", "read_result"]

LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM's `--max-lora-rank` takes."""


@dataclass(frozen=True)
class TrainedResult:
    """A training result as its folder records it: the base, and each trained node's adapter.

    `serve_command()` is the `vllm serve` command that serves it, one LoRA adapter per node.
    Read one with `read_result` (nothing loads), or load one with `load_trained`.
    """

    folder: Path
    """The training result (`final/` or a checkpoint), absolute."""
    base: str
    """The base model the adapters were trained on (checked against its fingerprint), or the
    result itself when it is one model (no adapter per node)."""
    adapters: Mapping[str, Path] = field(default_factory=dict)
    """Each trained node's adapter folder, by node; empty for a result that is one model."""

    @property
    def nodes(self) -> tuple[str, ...]:
        """The trained nodes, each with its own adapter (none for a result that is one model)."""
        return tuple(self.adapters)

    def serve_command(self, *, port: int | None = None) -> list[str]:
        """Return the `vllm serve` command that serves this result (`shlex.join` prints it).

        The base is served as recorded (its absolute folder, or its hub id), which is the name
        the base's requests use; each node's adapter is served under the node's name
        (`--lora-modules node=path`), at most `--max-loras` of them in one batch and their
        rank under `--max-lora-rank`. `--logprobs-mode processed_logprobs` makes the returned
        logprobs the sampled distribution's, as training records them.

        Raises:
            UsageError: a base vLLM cannot serve (flowlearn's embedded default model), or a
                lone adapter with no record of its nodes.

        """
        if embedded(self.base):
            raise UsageError(
                f"the base of {self.folder} is flowlearn's embedded model {self.base!r}, which "
                "vLLM cannot serve by that name; train on a model folder or hub id to serve it"
            )
        if not self.adapters and (self.folder / "adapter_config.json").is_file():
            raise UsageError(
                f"{self.folder} is one LoRA adapter with no record of its nodes (a planner "
                "trained alone): serve its base with `vllm serve BASE --enable-lora "
                f"--lora-modules planner={self.folder}`, or merge it into the base first"
            )
        command = ["vllm", "serve", self.base]
        if self.adapters:
            ranks = [adapter_rank(folder) for folder in self.adapters.values()]
            rank = next((r for r in LORA_RANKS if r >= max(ranks)), max(ranks))
            modules = [f"{node}={folder}" for node, folder in self.adapters.items()]
            command += ["--enable-lora", "--max-loras", str(len(modules))]
            command += ["--max-lora-rank", str(rank), "--lora-modules", *modules]
        command += ["--logprobs-mode", "processed_logprobs"]
        return command + (["--port", str(port)] if port is not None else [])

    def serve_command_line(self, *, port: int | None = None) -> str:
        """Return `serve_command` as one shell line."""
        return shlex.join(self.serve_command(port=port))


@dataclass(frozen=True)
class TrainedApp(TrainedResult):
    """A training result loaded for your app: its trained nodes' policies, local or served.

    Build it with `load_trained`. `chat_model()` is the chat model to build your app with;
    `graph(build_app)` builds it; `serve_command()` is the `vllm serve` command that serves
    the same result, one LoRA adapter per node.
    """

    policies: Any = None
    """A `NodePolicies` (each trained node's policy and the base's), or the one policy."""
    server_url: str | None = None
    """The vLLM server the policies call, or None when the model is loaded here."""

    def chat_model(self, node: str | None = None, **settings: Any) -> TrainableChatModel:
        """Return a LangChain chat model over the trained policies, for your app's nodes.

        Args:
            node: None (the usual): one model whose calls run on the calling LangGraph node's
                adapter, the base for a node not trained, as in training. A trained node's
                name: every call on that node's adapter, wherever it is made.
            settings: the chat model's fields: `temperature` (default 0, greedy), `top_p`,
                `max_new_tokens` (default 512), `stop`.

        Raises:
            UsageError: a node that was not trained.

        """
        if node is None:
            return TrainableChatModel.over(self.policies, **settings)
        if node not in self.adapters:
            raise UsageError(
                f"{node!r} was not trained in {self.folder}; its trained nodes are "
                f"{list(self.nodes)}. Use chat_model() for a model that runs each node's "
                "calls on its own adapter and the others on the base"
            )
        return TrainableChatModel(policy=self.policies[node], **settings)

    def graph(self, build: Callable[[Any], Any], **settings: Any) -> Any:
        """Build your app with `chat_model(**settings)`: `build` is the builder you trained."""
        return build(self.chat_model(**settings))


def load_trained(
    folder: str | os.PathLike[str],
    *,
    server_url: str | None = None,
    served_base: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    batch_size: int = 1,
    api_key_env: str | None = "OPENAI_API_KEY",
) -> TrainedApp:
    """Load a training result for your app: the base once, each trained node's adapter on it.

    Args:
        folder: the result: `final/` (or a checkpoint) of a run with an adapter per node
            (`flowlearn_adapters.json` names the base, checked against its fingerprint), or
            a model folder (every node's calls run on it).
        server_url: the vLLM server serving the result (`TrainedApp.serve_command`), e.g.
            `http://127.0.0.1:8000/v1`: each node's calls name its adapter there; only the
            tokenizer loads here. None: the model loads here.
        served_base: the name the server serves the base under (default: the recorded base,
            as `serve_command` serves it).
        device: "cpu", "cuda", ...; None picks CUDA when available (loaded here only).
        dtype: a torch dtype name; None: bf16 on CUDA, fp32 on CPU (loaded here only).
        batch_size: above 1, concurrent calls of every node decode in one batch of mixed
            adapters (loaded here only).
        api_key_env: the variable holding the server's key (vLLM `--api-key`), if any.

    Raises:
        UsageError: a folder that is not a result or a model, or whose base is gone or is not
            the model its adapters were trained on (the message says what to fix).

    """
    result = read_result(folder)
    root, base, adapters = result.folder, result.base, result.adapters
    if server_url is not None:
        policies = served_policies(root, base, adapters, server_url, served_base, api_key_env)
        return TrainedApp(root, base, adapters, policies, server_url)
    models = load_local_models(str(root), device=device, dtype=dtype, batch_size=batch_size)
    return TrainedApp(root, base, adapters, models.nodes or models.planner)


def read_result(folder: str | os.PathLike[str]) -> TrainedResult:
    """Read what a training result records (its base, checked, and its adapters); load nothing.

    Raises:
        UsageError: no folder there, or a record whose base is gone or is not the model its
            adapters were trained on (the message says what to fix).

    """
    root = Path(folder).expanduser().resolve()
    if not root.is_dir():
        raise UsageError(f"no training result at {root}: give the run's final/ folder")
    try:
        record = read_adapters_record(root)
    except ValueError as exc:  # SavedModelError too: a base that is gone or another model
        raise UsageError(str(exc)) from exc
    base, adapters = record if record is not None else (str(root), {})
    return TrainedResult(root, base, adapters)


def served_policies(
    root: Path,
    base: str,
    adapters: Mapping[str, Path],
    url: str,
    served_base: str | None,
    api_key_env: str | None,
) -> Any:
    """Return a `ServerPolicy` per trained node, naming its adapter, over the served base's."""
    tokenizer = result_tokenizer(root, base)
    vocab = base_vocab(base)

    def policy(name: str, version: str) -> ServerPolicy:
        return ServerPolicy(
            url,
            name,
            tokenizer=tokenizer,
            api_key_env=api_key_env,
            vocab_size=max(vocab, len(tokenizer)) if vocab else None,
            version=version,
        )

    base_name = served_base or base
    on_base = policy(base_name, f"{root.name}:base@server")
    if not adapters:
        return on_base
    trained = {node: policy(node, f"{root.name}:{node}@server") for node in adapters}
    return NodePolicies(trained, on_base)


def result_tokenizer(root: Path, base: str) -> Any:
    """Load the tokenizer training saved beside the adapters, else the base's.

    Raises:
        UsageError: neither loads here (prompts are rendered here, as token ids).

    """
    from transformers import AutoTokenizer

    sources = [root] if (root / "tokenizer_config.json").is_file() else []
    for source in [*sources, base]:
        try:
            return AutoTokenizer.from_pretrained(str(source))
        except (OSError, ValueError):
            continue
    raise UsageError(
        f"no tokenizer loads from {root} nor from its base {base}: the served nodes' prompts "
        "are rendered here with it; save the tokenizer into the result folder"
    )


def base_vocab(base: str) -> int:
    """Return the base's embedding rows (its config's `vocab_size`), or 0 when unknown here."""
    config = Path(base) / "config.json"
    if not config.is_file():
        return 0
    settings = read_json_record(config, "model config")
    text = settings.get("text_config") if isinstance(settings, dict) else None
    size = settings.get("vocab_size") if isinstance(settings, dict) else None
    size = size or (text.get("vocab_size") if isinstance(text, dict) else None)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 0


def adapter_rank(folder: Path) -> int:
    """Return the largest LoRA rank of the adapter in `folder` (its `r` and `rank_pattern`).

    Raises:
        SavedModelError: an adapter config without a whole-number rank.

    """
    settings = read_json_record(folder / "adapter_config.json", "LoRA adapter config")
    settings = settings if isinstance(settings, dict) else {}
    pattern = settings.get("rank_pattern")
    named = [settings.get("r"), *(pattern.values() if isinstance(pattern, dict) else ())]
    ranks = [r for r in named if isinstance(r, int) and not isinstance(r, bool) and r > 0]
    if not ranks or len(ranks) != len(named):
        raise SavedModelError(
            f"{folder}/adapter_config.json names no LoRA rank r; restore the file saved with it"
        )
    return max(ranks)
