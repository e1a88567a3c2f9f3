"""A forced choice by a local model's scores: which of a few fixed replies it finds likeliest.

The chat model's `choice` call setting (`HFChatModel`), named after vLLM's structured-output
`choice` ("the output will be exactly one of the choices"): each choice is scored as the
continuation of the chat (its final assistant message, or a new reply) by the sum of its tokens'
log-probabilities, all from the same point, in one batched forward pass; greedy takes the
likeliest, a temperature samples from their softmax. vLLM's guided decoding picks token by token
instead; when the choices differ in their first token (the verifier's STOP and CONTINUE do) the
two disagree only if a choice's later tokens are unlikely after its first. The shared prompt is
read once per choice (no KV cache shared between them): at two short choices after a verifier's
prompt this costs one batched forward, cheaper than the 8-token reply it replaces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from flowlearn.nodes.policies.hf import LocalPolicy, chat_prompt_ids
from flowlearn.nodes.schema.sampling import Messages


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
