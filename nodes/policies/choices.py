"""A forced choice by a local model's scores: which of a few fixed replies it finds likeliest.

The chat model's `choice` call setting (`HFChatModel`), named after vLLM's structured-output
`choice` ("the output will be exactly one of the choices"): each choice is scored as the
continuation of the chat (its final assistant message, or a new reply) by the sum of its tokens'
log-probabilities, read in one batched forward pass, and the likeliest is the reply. vLLM's
guided decoding picks token by token; the two agree whenever the choices differ in their first
token, as the verifier's STOP and CONTINUE do.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from flowlearn.nodes.policies.hf import LocalPolicy, chat_prompt_ids
from flowlearn.nodes.schema.sampling import Messages


def check_choices(choices: object) -> list[str]:
    """Return `choices` as a list of distinct non-empty strings.

    Raises:
        ValueError: anything else, named.

    """
    if (
        not isinstance(choices, (list, tuple))
        or len(choices) < 2
        or not all(isinstance(c, str) and c for c in choices)
        or len(set(choices)) != len(choices)
    ):
        raise ValueError(
            f"choice={choices!r}: give a list of at least two distinct non-empty strings, "
            'e.g. .bind(choice=["STOP", "CONTINUE"])'
        )
    return list(choices)


def _with(messages: Messages, reply: str) -> Messages:
    """`messages` with `reply` continuing the final assistant message, or as a new one."""
    if messages and messages[-1]["role"] == "assistant":
        last = messages[-1]
        return [*messages[:-1], {**last, "content": f"{last['content']}{reply}"}]
    return [*messages, {"role": "assistant", "content": reply}]


def choice_logprobs(policy: LocalPolicy, messages: Messages, choices: Sequence[str]) -> list[float]:
    """Return log p(choice | messages) under `policy`'s model for each choice, in order.

    A choice continues a final assistant message as written (give it its leading space, e.g.
    " STOP" after "Conclusion:"); otherwise it is scored as the whole of a new reply. The
    model's end-of-turn is not scored: a choice may be followed by anything.
    """
    import torch

    handle = policy.handle
    tokenizer = handle.tokenizer
    base = chat_prompt_ids(tokenizer, messages)  # ends where every choice begins
    rows = [chat_prompt_ids(tokenizer, _with(messages, choice)) for choice in choices]
    starts = [_shared(base, row) for row in rows]
    width = max(len(row) for row in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([row + [pad] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    scope: Any = getattr(policy, "forward_scope", contextlib.nullcontext)
    with handle.lock, scope(), torch.no_grad():
        model = handle.model
        logits = model(input_ids=ids.to(model.device), attention_mask=mask.to(model.device)).logits
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return [
        float(sum(logprobs[r, i - 1, row[i]] for i in range(max(start, 1), len(row))))
        for r, (row, start) in enumerate(zip(rows, starts, strict=True))
    ]


def choose(
    policy: LocalPolicy, messages: Messages, choices: list[str]
) -> tuple[str, dict[str, Any]]:
    """Return the likeliest of `choices` and the reply's metadata: its scores and a note."""
    scores = choice_logprobs(policy, messages, choices)
    best = choices[scores.index(max(scores))]
    said = ", ".join(f"{c!r} {s:.2f}" for c, s in zip(choices, scores, strict=True))
    return best, {
        "finish_reason": "stop",
        "choice_logprobs": dict(zip(choices, scores, strict=True)),
        "notes": [f"engine chose {best!r} by its log-probabilities ({said})"],
    }


def _shared(base: list[int], row: list[int]) -> int:
    """How many leading tokens `row` shares with `base` (where its choice's tokens begin)."""
    n = 0
    while n < min(len(base), len(row)) and base[n] == row[n]:
        n += 1
    return n
