"""A vLLM-shaped HTTP stand-in: completions from a tiny model, LoRA adapters loaded at run time.

It answers `/v1/completions` (token ids in, token ids and processed logprobs out, as
`vllm serve --logprobs-mode processed_logprobs` does) from the base model or a loaded adapter,
named by the request's `model`, `/v1/load_lora_adapter` / `/v1/unload_lora_adapter` as
vLLM's runtime LoRA endpoints do (the adapter folder is read when it is loaded, with peft,
merged into a copy of the base, and what the folder held at that moment is recorded), and
`/v1/models` as vLLM lists them: the base first, each adapter with the base as its `parent`.
Serve it with `stand_in_server(StandInLoraServer(...))`; `StandInLoraServer.serving(command)`
starts it as a `vllm serve BASE --enable-lora --lora-modules name=path ...` command would.
"""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stand_in_server import Recorded, Reply

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Sampling


@dataclass
class Load:
    name: str
    path: str
    files: list[str]
    """What the folder held when the server read it."""


@dataclass
class StandInLoraServer:
    """Serve `base_name` from `base` and any adapter loaded into it; record every call."""

    base: Any
    tokenizer: Any
    base_name: str = "base"
    load_reply: Reply | None = None
    """Answer every load with this instead (a server error)."""
    models_reply: Reply | None = None
    """Answer `/v1/models` with this instead (a server that does not list its models)."""
    loads: list[Load] = field(default_factory=list)
    unloads: list[str] = field(default_factory=list)
    models_named: list[str] = field(default_factory=list)
    """The `model` of every completions request, in arrival order."""
    events: list[str] = field(default_factory=list)
    """`load:NAME`, `unload:NAME` and `complete:NAME`, in arrival order."""
    stops: list[list[str]] = field(default_factory=list)
    """The `stop` strings of every completions request that had some, in arrival order."""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._served = {self.base_name: self._decoder(self.base)}

    @classmethod
    def serving(cls, command: list[str]) -> StandInLoraServer:
        """Start as `command` (`vllm serve BASE [options]`) starts vLLM, as far as it matters here.

        The base loads from BASE and is served under that name; each `--lora-modules
        name=path` adapter loads at start, which vLLM refuses without `--enable-lora` or
        with a rank above `--max-lora-rank` (16 by default).
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if command[:2] != ["vllm", "serve"] or len(command) < 3:
            raise ValueError(f"not a `vllm serve MODEL` command: {command}")
        base, options, flag = command[2], {}, None
        for word in command[3:]:
            if word.startswith("--"):
                flag = word
                options[flag] = []
            elif flag is not None:
                options[flag].append(word)
        model = AutoModelForCausalLM.from_pretrained(base).eval()
        server = cls(model, AutoTokenizer.from_pretrained(base), base_name=base)
        modules = options.get("--lora-modules", [])
        if modules and "--enable-lora" not in options:
            raise ValueError("--lora-modules needs --enable-lora")
        rank = int(options.get("--max-lora-rank", ["16"])[0])
        for module in modules:
            name, path = module.split("=", 1)
            settings = json.loads((Path(path) / "adapter_config.json").read_text())
            if settings["r"] > rank:
                raise ValueError(f"adapter {name} has rank {settings['r']} > --max-lora-rank")
            reply = server._load({"lora_name": name, "lora_path": path})
            if reply.status != 200:
                raise ValueError(f"adapter {name} did not load: {reply.body}")
        return server

    def _decoder(self, model: Any) -> BatchingPolicy:
        return BatchingPolicy(HFPolicy(model, self.tokenizer), max_wait_s=0.0)

    def __call__(self, request: Recorded) -> Reply:
        route = request.path.rsplit("/", 1)[-1]
        if route == "load_lora_adapter":
            return self._load(request.body)
        if route == "unload_lora_adapter":
            return self._unload(request.body["lora_name"])
        if route == "completions":
            return self._complete(request.body)
        if route == "models" and self.models_reply is None:
            return self._models()
        if route == "models":
            return self.models_reply
        return Reply(404, {"detail": "Not Found"})

    def _models(self) -> Reply:
        with self._lock:
            adapters = [name for name in self._served if name != self.base_name]
        base = {"id": self.base_name, "object": "model", "root": self.base_name, "parent": None}
        cards = [
            {"id": n, "object": "model", "root": n, "parent": self.base_name} for n in adapters
        ]
        return Reply(200, {"object": "list", "data": [base, *cards]})

    def _load(self, body: dict[str, str]) -> Reply:
        name, path = body["lora_name"], body["lora_path"]
        folder = Path(path)
        files = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        with self._lock:
            self.loads.append(Load(name, path, files))
            self.events.append(f"load:{name}")
        if self.load_reply is not None:
            return self.load_reply
        if name in self._served:
            message = f"The lora adapter '{name}' has already been loaded."
            return Reply(400, {"object": "error", "message": message, "code": 400})
        from peft import PeftModel

        merged = PeftModel.from_pretrained(copy.deepcopy(self.base), path).merge_and_unload()
        with self._lock:
            self._served[name] = self._decoder(merged.eval())
        return Reply(200, f"Success: LoRA adapter '{name}' added successfully.")

    def _unload(self, name: str) -> Reply:
        with self._lock:
            self.unloads.append(name)
            self.events.append(f"unload:{name}")
            decoder = self._served.pop(name, None)
        if decoder is None:
            return Reply(404, {"message": f"The lora adapter '{name}' cannot be found."})
        decoder.close()
        return Reply(200, f"Success: LoRA adapter '{name}' removed successfully.")

    def _complete(self, body: dict[str, Any]) -> Reply:
        name = body["model"]
        with self._lock:
            self.models_named.append(name)
            self.events.append(f"complete:{name}")
            decoder = self._served.get(name)
        if decoder is None:
            return Reply(404, {"message": f"The model `{name}` does not exist."})
        sampling = Sampling(
            temperature=body["temperature"],
            top_p=body["top_p"],
            max_new_tokens=body["max_tokens"],
            seed=body.get("seed"),
        )
        generation = decoder.submit(list(body["prompt"]), sampling).result()
        completion, logprobs = generation.completion_ids or [], generation.logprobs or []
        full = len(completion) >= body["max_tokens"]  # else it ended at EOS, as vLLM says
        finish = {"finish_reason": "length" if full else "stop", "stop_reason": None}
        text = generation.text
        if body.get("stop"):
            with self._lock:
                self.stops.append(list(body["stop"]))
            completion, logprobs, text, finish = self._stopped(
                body["stop"], completion, logprobs, finish
            )
        choice = {
            "text": text,
            "token_ids": completion,
            "prompt_token_ids": body["prompt"],
            "logprobs": {
                "tokens": [f"token_id:{i}" for i in completion],
                "token_logprobs": logprobs,
            },
            **finish,
        }
        usage = {"completion_tokens": len(completion), "prompt_tokens": len(body["prompt"])}
        return Reply(200, {"choices": [choice], "usage": usage})

    def _stopped(
        self, stop: list[str], ids: list[int], logprobs: list[float], unstopped: dict[str, Any]
    ) -> tuple[list[int], list[float], str, dict[str, Any]]:
        """Apply `stop` as vLLM does: ids up to the token completing it, text without it."""
        for end in range(1, len(ids) + 1):
            text = self.tokenizer.decode(ids[:end], skip_special_tokens=True)
            hits = sorted((text.find(s), s) for s in stop if s in text)
            if hits:
                at, string = hits[0]
                finish = {"finish_reason": "stop", "stop_reason": string}
                return ids[:end], logprobs[:end], text[:at], finish
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return ids, logprobs, text, unstopped

    def close(self) -> None:
        for decoder in self._served.values():
            decoder.close()
