"""A local Hugging Face causal LM as the planner's policy, logging the exact tokens it samples."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from flowlearn.nodes.policies.call_config import only_config
from flowlearn.nodes.policies.handle import ModelHandle
from flowlearn.nodes.policies.loading import load_model_and_tokenizer
from flowlearn.nodes.policies.stops import StopWatch
from flowlearn.nodes.schema.sampling import Generation, Messages, Sampling

logger = logging.getLogger(__name__)


@runtime_checkable
class LocalPolicy(Protocol):
    """A policy on a local model's handle: an `HFPolicy`, or a wrapper such as `BatchingPolicy`."""

    @property
    def handle(self) -> ModelHandle:
        """The model, tokenizer and lock the policy runs on."""
        ...

    @property
    def version(self) -> str:
        """The policy version recorded in every transition."""
        ...

    def generate(
        self,
        messages: Messages,
        sampling: Sampling,
        *,
        streamer: Any = None,
        stopping: StopWatch | None = None,
    ) -> Generation:
        """Sample one completion; a `streamer` gets its tokens, a `stopping` watch ends it."""
        ...


class HFPolicy:
    """Wrap a transformers causal LM and tokenizer as a token-faithful `Policy`.

    The chat template is applied here, at the boundary, and the ids fed to and sampled from the
    model are recorded as they are. `logprobs[j]` is the log-probability of `completion_ids[j]`
    under `log_softmax(logits / temperature)`, the distribution the token was sampled from and
    the one TRL recomputes at the same temperature (greedy decoding, temperature 0, records it
    at temperature 1). Top-p only truncates that distribution's tail, as in TRL and vLLM.

    Calls are serialised by the lock of the policy's `ModelHandle`, shared by every policy built
    on that handle (`HFPolicy.on`): one generate at a time (`BatchingPolicy` coalesces
    concurrent calls instead).
    """

    continues_prefill = True  # a final assistant message is continued (`chat_prompt_ids`)

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        version: str | None = None,
        context_window: int | None = None,
    ) -> None:
        """Wrap `model` and `tokenizer` on a new handle.

        Args:
            model: a transformers causal LM.
            tokenizer: its tokenizer, with a chat template.
            version: the policy version recorded in every transition.
            context_window: the most tokens prompt plus completion may take; default the
                model's `max_position_embeddings`. Longer prompts are cut to fit (`fit_prompt`).

        """
        self._bind(ModelHandle(model, tokenizer), version, context_window)

    @classmethod
    def on(
        cls,
        handle: ModelHandle,
        *,
        version: str | None = None,
        context_window: int | None = None,
    ) -> HFPolicy:
        """Build a policy on an existing handle: it shares that model's lock."""
        policy = cls.__new__(cls)
        policy._bind(handle, version, context_window)
        return policy

    def _bind(self, handle: ModelHandle, version: str | None, context_window: int | None) -> None:
        self.handle = handle
        config = handle.model.config
        name = getattr(config, "name_or_path", "") or type(handle.model).__name__
        self.version = version or f"{os.path.basename(str(name).rstrip('/')) or name}@0"
        self.context_window = context_window or getattr(config, "max_position_embeddings", None)

    @property
    def model(self) -> Any:
        """The wrapped causal LM."""
        return self.handle.model

    @property
    def tokenizer(self) -> Any:
        """Its tokenizer."""
        return self.handle.tokenizer

    def forward_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Return the context its forwards run in (the batched decoder's too): none here."""
        return contextlib.nullcontext()

    @classmethod
    def from_pretrained(
        cls,
        source: str | os.PathLike[str] | None = None,
        *,
        device: str | None = None,
        dtype: str | None = None,
        version: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
    ) -> HFPolicy:
        """Load from a hub id, a local folder, a .gguf file, or the embedded default (None).

        `cache_dir` is where the converted default model is kept (`load_model_and_tokenizer`).
        """
        model, tokenizer = load_model_and_tokenizer(
            source, device=device, dtype=dtype, cache_dir=cache_dir
        )
        return cls(model, tokenizer, version=version)

    def encode_chat(self, messages: Messages) -> list[int]:
        """Render `messages` with the chat template and return the prompt's token ids."""
        return chat_prompt_ids(self.tokenizer, messages)

    def fit_prompt(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[str]]:
        """Cut a prompt too long for the context window, keeping its head and its tail.

        The head holds the instructions and the start of the question, the tail the latest
        memory and the turn's format; the middle goes. Returns the ids actually fed and a note
        saying what was cut (recorded in the transition), or no note when it fits.

        Raises:
            ValueError: `max_new_tokens` leaves too little of the window for any prompt.

        """
        window = self.context_window
        if window is None or len(prompt_ids) + max_new_tokens <= window:
            return prompt_ids, []
        room = window - max_new_tokens
        if room < 32:
            raise ValueError(
                f"max_new_tokens={max_new_tokens} leaves {room} tokens of the model's "
                f"{window}-token window for the prompt; lower max_new_tokens"
            )
        head = room // 2
        tail = room - head
        note = (
            f"prompt truncated: {len(prompt_ids)} tokens did not fit the {window}-token window "
            f"with max_new_tokens={max_new_tokens}; kept the first {head} and the last {tail}"
        )
        logger.warning(note)
        return prompt_ids[:head] + prompt_ids[-tail:], [note]

    def generate(
        self,
        messages: Messages,
        sampling: Sampling,
        *,
        streamer: Any = None,
        stopping: StopWatch | None = None,
    ) -> Generation:
        """Sample one completion and return its text, ids and per-token logprobs.

        Args:
            messages: the chat, rendered here with the tokenizer's chat template.
            sampling: temperature, top_p, max_new_tokens and seed.
            streamer: an optional transformers streamer that receives tokens as they come.
            stopping: an optional watch that ends the call early, as a `StoppingCriteria`.

        """
        import torch
        from transformers import GenerationConfig

        prompt_ids, notes = self.fit_prompt(self.encode_chat(messages), sampling.max_new_tokens)
        greedy = sampling.temperature == 0
        # Only what `sampling` names: top_k=0 turns off the library's default top_k=50, and
        # `only_config` keeps the model's own config from filling the fields left unset.
        shape = (
            {"do_sample": False}
            if greedy
            else {
                "do_sample": True,
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": 0,
            }
        )
        config = GenerationConfig(
            **shape,
            max_new_tokens=sampling.max_new_tokens,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_id=self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        start = time.perf_counter()
        with self.handle.lock, torch.no_grad(), only_config(self.model, config):
            if sampling.seed is not None:
                torch.manual_seed(sampling.seed)
            device = self.model.device
            inputs = torch.tensor([prompt_ids], device=device)
            out = self.model.generate(
                input_ids=inputs,
                attention_mask=torch.ones_like(inputs),
                generation_config=config,
                streamer=streamer,
                stopping_criteria=[stopping.criteria(len(prompt_ids))] if stopping else None,
            )
        completion = out.sequences[0, len(prompt_ids) :].tolist()
        completion = completion[: len(out.logits)]
        logprobs = token_logprobs(out.logits, completion, sampling.temperature)
        return Generation(
            text=self.tokenizer.decode(completion, skip_special_tokens=True),
            prompt_ids=prompt_ids,
            completion_ids=completion,
            logprobs=logprobs,
            policy_version=self.version,
            sampling=sampling.as_dict(),
            seconds=time.perf_counter() - start,
            notes=notes,
        )


def chat_prompt_ids(tokenizer: Any, messages: Messages) -> list[int]:
    """Render `messages` with the tokenizer's chat template and return the prompt's ids.

    A final assistant message is a prefill: the model continues it instead of starting a new
    turn (the chat model uses this to start a forced tool call's JSON).
    """
    prefill = bool(messages) and messages[-1]["role"] == "assistant"
    ids = tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
        tokenize=True,
        return_dict=False,
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def token_logprobs(logits: Any, token_ids: list[int], temperature: float) -> list[float]:
    """Return log p(token) under `log_softmax(logits / temperature)` for each step's token.

    `logits` are per-step raw logits, (1, vocab) tensors or one (steps, vocab) tensor; greedy
    (temperature 0) is scored at temperature 1.
    """
    import torch

    if not token_ids:
        return []
    stacked = torch.stack([row.reshape(-1) for row in logits[: len(token_ids)]]).float()
    scaled = stacked / (temperature if temperature > 0 else 1.0)
    chosen = torch.tensor(token_ids, device=scaled.device).unsqueeze(1)
    picked = torch.log_softmax(scaled, dim=-1).gather(1, chosen).squeeze(1)
    return [float(x) for x in picked.tolist()]


def stream_text(
    policy: LocalPolicy, messages: Messages, sampling: Sampling, stopping: StopWatch | None = None
) -> Iterator[str]:
    """Yield the decoded text of one completion piece by piece as the model writes it."""
    from transformers import TextIteratorStreamer

    tokenizer = policy.handle.tokenizer
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["generation"] = policy.generate(
                messages, sampling, streamer=streamer, stopping=stopping
            )
        except BaseException as exc:  # re-raised in the consumer's thread below
            result["error"] = exc
            streamer.end()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    yield from streamer
    worker.join()
    if "error" in result:
        raise result["error"]
