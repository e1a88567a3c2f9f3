"""Local Hugging Face policies over the token core: chat template -> ids -> `tokens.sample`.

`HFPolicy` renders the chat with the model's template, fits the prompt to the context window and
decodes it with the core, logging the exact tokens it samples; `FrozenBasePolicy` is the same
over a LoRA model with its adapter switched off. A forced choice is scored here too
(`choice_logprobs`), since it is the local model's forward over the rendered chat.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from flowlearn.engine.loading import load_model_and_tokenizer
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.stops import StopWatch
from flowlearn.engine.tokens import ModelHandle, sample

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
        prompt_ids, notes = self.fit_prompt(self.encode_chat(messages), sampling.max_new_tokens)
        return self.generate_ids(prompt_ids, sampling, notes, streamer=streamer, stopping=stopping)

    def generate_ids(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        notes: Sequence[str] = (),
        *,
        streamer: Any = None,
        stopping: StopWatch | None = None,
    ) -> Generation:
        """Decode a prompt given as token ids, fed as they are (`tokens.sample`)."""
        return sample(self, prompt_ids, sampling, notes=notes, streamer=streamer, stopping=stopping)


class FrozenBasePolicy(HFPolicy):
    """Generate with the PEFT adapter of `policy`'s model disabled.

    It is built on `policy`'s handle, so it shares that model's lock with every policy on the
    same handle: the adapter is never toggled under a running call of the trained policy,
    batched or not. Its forward scope switches the adapter off, for a single call
    (`tokens.sample`), a batched one (`BatchDecoder`) and a scored choice alike.
    """

    def __init__(self, policy: HFPolicy) -> None:
        """Serve the base of `policy`'s (PEFT) model, versioned `<policy version>:base`."""
        self._bind(policy.handle, f"{policy.version}:base", policy.context_window)

    def forward_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Switch every adapter off (the caller holds the handle's lock)."""
        return adapters_off(self.model)


_TUNED: weakref.WeakKeyDictionary[Any, tuple[list[Any], list[Any]]] = weakref.WeakKeyDictionary()
"""Each PEFT model's tuner layers and adapter weights, found once (a walk over every module
costs milliseconds, and an adapter switch happens at every decode step)."""


def tuned_parts(model: Any) -> tuple[list[Any], list[Any]]:
    """Return the PEFT tuner layers of `model` and its adapter weights (cached per model)."""
    found = _TUNED.get(model)
    if found is None:
        from peft.tuners.tuners_utils import BaseTunerLayer

        layers: list[Any] = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
        weights = [p for layer in layers for n, p in layer.named_parameters() if "lora_" in n]
        found = _TUNED[model] = (layers, weights)
    return found


@contextlib.contextmanager
def trainability_kept(model: Any) -> Iterator[None]:
    """Run the block, then give every adapter weight its `requires_grad` back.

    PEFT's adapter switches (`set_adapter`, leaving `disable_adapter`) leave only the active
    adapter trainable; a model training several adapters with one optimizer must keep them all.
    """
    flags = [(p, p.requires_grad) for p in tuned_parts(model)[1]]
    try:
        yield
    finally:
        for parameter, trainable in flags:
            parameter.requires_grad_(trainable)


@contextlib.contextmanager
def adapters_off(model: Any) -> Iterator[None]:
    """Run the block with every adapter of a PEFT model off, their trainability kept."""
    with trainability_kept(model), model.disable_adapter():
        yield


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


# A forced choice by the local model's scores: which of a few fixed replies it finds likeliest.
#
# The chat model's `choice` call setting (`HFChatModel`), named after vLLM's structured-output
# `choice` ("the output will be exactly one of the choices"): each choice is scored as the
# continuation of the chat (its final assistant message, or a new reply) by the sum of its tokens'
# log-probabilities, all from the same point, in one batched forward pass; greedy takes the
# likeliest, a temperature samples from their softmax. vLLM's guided decoding picks token by token
# instead; when the choices differ in their first token (the verifier's STOP and CONTINUE do) the
# two disagree only if a choice's later tokens are unlikely after its first. The shared prompt is
# read once per choice (no KV cache shared between them): at two short choices after a verifier's
# prompt this costs one batched forward, cheaper than the 8-token reply it replaces.


@runtime_checkable
class ScoringPolicy(LocalPolicy, Protocol):
    """A local policy whose forwards run in a scope of its own (`HFPolicy`, `BatchingPolicy`).

    A `FrozenBasePolicy`'s scope switches its adapter off: scores are the base model's.
    """

    def forward_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Return the context the model's forwards run in (the handle's lock held)."""
        ...


def check_choices(choices: object) -> list[str]:
    """Return `choices` as a list of distinct strings, each with a non-space character.

    Raises:
        ValueError: anything else, named.

    """
    if (
        not isinstance(choices, (list, tuple))
        or len(choices) < 2
        or not all(isinstance(c, str) and c.strip() for c in choices)
        or len(set(choices)) != len(choices)
    ):
        raise ValueError(
            f"choice={choices!r}: give a list of at least two distinct strings that are not "
            'blank, e.g. .bind(choice=["STOP", "CONTINUE"])'
        )
    return list(choices)


def _with(messages: Messages, reply: str) -> Messages:
    """`messages` with `reply` continuing the final assistant message, or as a new one."""
    if messages and messages[-1]["role"] == "assistant":
        last = messages[-1]
        return [*messages[:-1], {**last, "content": f"{last['content']}{reply}"}]
    return [*messages, {"role": "assistant", "content": reply}]


def choice_logprobs(
    policy: ScoringPolicy, messages: Messages, choices: Sequence[str]
) -> list[float]:
    """Return log p(choice | messages) under `policy`'s model for each choice, in order.

    A choice continues a final assistant message as written (give it its leading space, e.g.
    " STOP" after "Conclusion:"); otherwise it is scored as the whole of a new reply. Every
    choice is scored from the first token where any of them departs from the prompt (a choice
    that merges with the prompt's last token is then compared fairly). The end of turn is not
    scored: a choice may be followed by anything.

    Raises:
        ValueError: the prompt with a choice does not fit the model's context window.

    """
    import torch

    handle = policy.handle
    tokenizer, model = handle.tokenizer, handle.model
    base = chat_prompt_ids(tokenizer, messages)  # ends where every choice begins
    rows = [chat_prompt_ids(tokenizer, _with(messages, choice)) for choice in choices]
    start = max(1, min(_shared(base, row) for row in rows))
    width = max(len(row) for row in rows)
    window = getattr(policy, "context_window", None) or getattr(
        model.config, "max_position_embeddings", None
    )
    if window is not None and width > window:
        raise ValueError(
            f"a choice's prompt is {width} tokens, over the model's {window}-token window: "
            "shorten the conversation"
        )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows], device=model.device)
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    keep = width - start + 1  # the logits that predict tokens start .. width - 1
    with handle.lock, policy.forward_scope(), torch.no_grad():
        mask = mask.to(model.device)
        out = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep, use_cache=False)
    logits = out.logits[:, -keep:-1].float()  # position p predicts token p + 1
    picked = torch.log_softmax(logits, dim=-1).gather(2, ids[:, start:].unsqueeze(2)).squeeze(2)
    real = mask[:, start:].bool()
    return [float(x) for x in (picked * real).sum(dim=1).tolist()]


def choose(
    policy: ScoringPolicy, messages: Messages, choices: list[str], temperature: float = 0.0
) -> tuple[str, dict[str, Any]]:
    """Return the likeliest of `choices` (sampled at `temperature` > 0) and the reply's metadata.

    The metadata holds the choices' scores (`choice_logprobs`) and a note saying the choice.
    """
    import torch

    scores = choice_logprobs(policy, messages, choices)
    if temperature > 0:
        weights = torch.softmax(torch.tensor(scores) / temperature, dim=0)
        best = choices[int(torch.multinomial(weights, 1))]
    else:
        best = choices[scores.index(max(scores))]
    said = ", ".join(f"{c!r} {s:.2f}" for c, s in zip(choices, scores, strict=True))
    how = f"sampled at temperature {temperature}" if temperature > 0 else "the likeliest"
    return best, {
        "finish_reason": "stop",
        "choice_logprobs": dict(zip(choices, scores, strict=True)),
        "notes": [f"engine chose {best!r}, {how} by its log-probabilities ({said})"],
    }


def _shared(base: list[int], row: list[int]) -> int:
    """How many leading tokens `row` shares with `base` (where its choice's tokens begin)."""
    n = 0
    while n < min(len(base), len(row)) and base[n] == row[n]:
        n += 1
    return n
