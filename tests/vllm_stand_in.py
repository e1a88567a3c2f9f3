"""Stand-ins of TRL's `VLLMGeneration` and `VLLMClient` that sample with a tiny local model.

vLLM cannot be installed on the test machines. These keep TRL's interface (the methods and
fields the flow uses, with the installed TRL's signatures) and its behaviour that matters here:
the engine holds its own copy of the weights, refreshed only by `sync_weights`; `generate`
returns per prompt the prompt ids, the sampled ids and each token's logprob after temperature
(`logprobs_mode` processed), as lists of rank-0 lists; in server mode TRL's `generate` is
collective, so the stand-in's refuses to be called. Every call is recorded in a shared list.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

Events = list[tuple[str, Any]]
"""What happened, in order: ("sync", weight checksum), ("generate", prompts), ("step", ...)."""


def checksum(model: Any) -> float:
    """Return a number that changes whenever any weight does."""
    with torch.no_grad():
        return float(sum(p.double().abs().sum() for p in model.parameters()))


class TinyEngine:
    """The engine's own copy of the model, as vLLM holds one: stale until `load`."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.model = copy.deepcopy(model).eval()
        # TRL patches `forward` on the instance, closing over the original model: drop the copy
        # of that patch, or the engine would sample with the live weights, synced or not.
        self.model.__dict__.pop("forward", None)
        self.tokenizer = tokenizer

    def load(self, model: Any) -> None:
        """Take the trained model's weights (what `sync_weights` pushes)."""
        self.model.load_state_dict(model.state_dict())

    def sample(
        self, prompts: list[list[int]], temperature: float, max_tokens: int, seed: Any = None
    ) -> tuple[list[list[int]], list[list[float]]]:
        """Sample each prompt in one left-padded batch; return ids and tempered logprobs."""
        from transformers import GenerationConfig

        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        config = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_tokens,
            pad_token_id=pad,
            eos_token_id=eos,
            return_dict_in_generate=True,
            output_logits=True,
        )
        if seed is not None:
            torch.manual_seed(seed)
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        logps = torch.log_softmax(torch.stack(out.logits, 1).float() / temperature, -1)
        completions, logprobs = [], []
        for row, sequence in enumerate(out.sequences[:, width:].tolist()):
            length = sequence.index(eos) + 1 if eos in sequence else len(sequence)
            completions.append(sequence[:length])
            logprobs.append([float(logps[row, j, t]) for j, t in enumerate(sequence[:length])])
        return completions, logprobs


class StandInVLLMGeneration:
    """TRL's `VLLMGeneration` as the flow sees it: its sampling fields, generate, sync_weights."""

    def __init__(
        self,
        model: Any,
        accelerator: Any,
        processing_class: Any,
        mode: str = "colocate",
        *,
        events: Events | None = None,
    ) -> None:
        self.model, self.accelerator, self.processing_class = model, accelerator, processing_class
        self.mode = mode
        self.temperature, self.top_p, self.top_k, self.min_p = 1.0, 1.0, 0, 0.0
        self.repetition_penalty, self.max_completion_length, self.logprobs = 1.0, 16, 0
        self.generation_kwargs: dict[str, Any] = {}
        self.structured_outputs_regex: str | None = None
        self.max_model_length: int | None = None
        self.engine = TinyEngine(model, processing_class)
        self.events: Events = events if events is not None else []

    def sync_weights(self) -> None:
        """Push the trained model's weights into the engine, and record their checksum."""
        self.engine.load(self.model)
        self.events.append(("sync", checksum(self.model)))

    def generate(
        self,
        prompts: list[list[int]],
        images: list[list[Any] | None] | None,
        num_generations: int,
        profiler: Any = None,
    ) -> tuple[Any, ...]:
        """Sample like TRL's colocate generate; refuse in server mode, where TRL's gathers."""
        if self.mode == "server":
            raise AssertionError(
                "TRL's server-mode generate gathers every rank's prompts (a collective): the "
                "flow must generate through its rank's own client"
            )
        self.events.append(("generate", len(prompts)))
        repeated = [p for p in prompts for _ in range(num_generations)]
        completions, logprobs = self.engine.sample(
            repeated,
            self.temperature,
            self.max_completion_length,
            self.generation_kwargs.get("seed"),
        )
        return repeated, completions, ranked(logprobs), ranked(completions)


class StandInClient:
    """TRL's `VLLMClient` of one rank, on the stand-in server that the generation holds."""

    base_url = "http://127.0.0.1:8000"

    def __init__(
        self, generation: StandInVLLMGeneration, logprobs_mode: str = "processed_logprobs"
    ) -> None:
        self.generation, self.logprobs_mode = generation, logprobs_mode
        self.requests: list[dict[str, Any]] = []

    def get_server_info(self) -> dict[str, Any]:
        """Return the part of vLLM's `/server_info` the flow reads."""
        return {"model_config": {"logprobs_mode": self.logprobs_mode, "max_model_len": 8192}}

    def generate(
        self,
        prompts: list[list[int]],
        features: Any = None,
        n: int = 1,
        repetition_penalty: float = 1.0,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        min_p: float = 0.0,
        max_tokens: int = 16,
        logprobs: int | None = 0,
        structured_outputs_regex: str | None = None,
        generation_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Answer like `VLLMClient.generate`: one request, this rank's prompts only."""
        self.requests.append({"prompts": len(prompts), "temperature": temperature, "top_p": top_p})
        self.generation.events.append(("generate", len(prompts)))
        repeated = [p for p in prompts for _ in range(n)]
        seed = (generation_kwargs or {}).get("seed")
        completions, logps = self.generation.engine.sample(repeated, temperature, max_tokens, seed)
        return {
            "prompt_ids": prompts,
            "completion_ids": completions,
            "logprobs": ranked(logps),
            "logprob_token_ids": ranked(completions),
        }


def ranked(rows: list[list[Any]]) -> list[list[list[Any]]]:
    """Wrap each token's value in a list of one: TRL's (sequence, token, rank) layout."""
    return [[[value] for value in row] for row in rows]
