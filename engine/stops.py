"""When an engine call ends before its budget: a stop string, or a degenerate repetition.

1. Stop strings are matched on the decoded text, not on token ids: a string such as
   `</answer>` is spelled by different tokens in different contexts (`</`, `answer`, `>` or
   `>.`), and only the text says where it ends. The text grows incrementally, as vLLM and TGI
   detokenize (`IncrementalText`): each token decodes a window of a few tokens instead of the
   whole completion, so a string split across token boundaries, or across a multi-byte
   character, is found at the token that completes it. Decoding the whole completion after
   each token cost O(n) per token: 22% of the batching worker's time on the tiny rollout bench
   (bench/rollout_speed.py --tiny, 64 tokens a call; py-spy), and more at longer budgets.
2. A small greedy model stuck in a loop repeats one sentence until its budget runs out. The
   repetition rule stops it once the completion ends in an exact token-level cycle, long and
   repeated enough that normal prose never makes one (`RepetitionRule`).
3. Neither changes a logit: a `StopWatch` only ends the call, so the logprobs of the tokens
   generated before the stop are those of an unstopped call (what training relies on).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

StopReason = Literal["stop", "repetition"]


@dataclass(frozen=True, kw_only=True)
class RepetitionRule:
    """Stop when the last tokens are one block of at most `max_period` tokens, repeated.

    The rule: the completion ends in `r` back-to-back copies of a `p`-token block, with
    `1 <= p <= max_period`, `r >= min_repeats` and `p * r >= min_span`. A 12-token sentence
    stops at its 4th copy (48 tokens); a single token must repeat 48 times, a 2-token pair 24.
    The copies must be identical token for token, so a list that varies (`1, 2, 3, ...`) or a
    paraphrase never matches, and the first copy, often tokenized differently after the text
    before it, is not needed.

    >>> RepetitionRule().period([7] * 10 + [1, 2, 3] * 16)
    3
    >>> RepetitionRule().period(list(range(100))) is None
    True
    """

    max_period: int = 50
    """The longest block (in tokens) the rule looks for."""
    min_repeats: int = 4
    """How many back-to-back copies of the block it takes, at least."""
    min_span: int = 48
    """How many tokens the copies must cover together, at least (so short blocks repeat more)."""

    def __post_init__(self) -> None:
        if min(self.max_period, self.min_repeats, self.min_span) < 1 or self.min_repeats < 2:
            raise ValueError(f"a repetition rule needs positive sizes and min_repeats >= 2: {self}")

    def period(self, ids: Sequence[int]) -> int | None:
        """Return the shortest block length the end of `ids` repeats per the rule, or None."""
        n = len(ids)
        for p in range(1, self.max_period + 1):
            span = p * max(self.min_repeats, math.ceil(self.min_span / p))
            if span > n:
                break
            if ids[n - 1] != ids[n - 1 - p]:  # the cheap test rules most periods out
                continue
            if all(ids[i] == ids[i - p] for i in range(n - span + p, n)):
                return p
        return None


@dataclass(eq=False)
class StopWatch:
    """Watch one completion token by token; say when and why it should end.

    Built per call by the chat model, handed to the policy (`generate(..., stopping=watch)`),
    which calls `update` after each sampled token (the batched loop directly, a single
    `generate` through `criteria()`); afterwards `reason` and `detail` say why it stopped.

    Attributes:
        decode: turns completion token ids into text (the tokenizer's, special tokens skipped).
        stop: strings that end the call once the completion's text contains one.
        repetition: the degenerate-repetition rule; None turns it off.
        json_prefix: when set, the text the reply continues (a forced tool call's prefill):
            the call ends as soon as that prefix and the completion make a whole JSON object,
            instead of running on to its budget after the call.
        ends: a test of the completion's text that ends the call once it holds (the planner's:
            its plan is complete at the end of a line, `nodes.planner.plan_complete`).
        reason: "stop" (a stop string, or the JSON closed) or "repetition", once it fired.
        detail: the stop string matched, or a description of the JSON close or repetition.
        tokens: how many completion tokens there were when it fired.

    """

    decode: Callable[[list[int]], str]
    stop: tuple[str, ...] = ()
    repetition: RepetitionRule | None = field(default_factory=RepetitionRule)
    json_prefix: str | None = None
    ends: Callable[[str], bool] | None = None
    reason: StopReason | None = None
    detail: str = ""
    tokens: int = 0
    _text: IncrementalText | None = field(default=None, init=False, repr=False, compare=False)

    def update(self, completion: Sequence[int]) -> bool:
        """Check the completion so far (its newest token last); True: end the call now."""
        if self.reason is not None:
            return True
        if self.stop or self.json_prefix is not None or self.ends is not None:
            if self._text is None:
                self._text = IncrementalText(self.decode)
            text = self._text.update(completion)
            if self.ends is not None and self.ends(text):
                self._fire("stop", "complete", len(completion))
                return True
            hits = [(text.find(s), s) for s in self.stop if s in text]
            if hits:
                self._fire("stop", min(hits)[1], len(completion))
                return True
            if self.json_prefix is not None and _whole_json(self.json_prefix + text):
                self._fire("stop", "", len(completion))
                return True
        period = self.repetition.period(completion) if self.repetition else None
        if period is not None:
            assert self.repetition is not None
            copies = max(self.repetition.min_repeats, math.ceil(self.repetition.min_span / period))
            self._fire(
                "repetition", f"a {period}-token block repeated {copies} times", len(completion)
            )
            return True
        return False

    def _fire(self, reason: StopReason, detail: str, tokens: int) -> None:
        self.reason, self.detail, self.tokens = reason, detail, tokens

    def cut(self, text: str) -> str:
        """Return `text` up to the first stop string (excluded, as LangChain's `stop` means)."""
        return cut_at_stop(text, self.stop)

    def note(self) -> str | None:
        """Say in a line why the call ended early (for the transition's notes), or None."""
        if self.reason == "stop" and self.detail == "complete":
            return f"stopped after {self.tokens} tokens, where the reply was complete"
        if self.reason == "stop" and not self.detail:
            return "engine stopped where the tool call's JSON object closed"
        if self.reason == "stop":
            return f"engine stopped at the stop string {self.detail!r}"
        if self.reason == "repetition":
            return (
                f"engine stopped a degenerate repetition after {self.tokens} tokens: {self.detail}"
            )
        return None

    def criteria(self, prompt_length: int) -> Any:
        """Return this watch as a transformers `StoppingCriteria` (one sequence per call)."""
        from transformers import StoppingCriteria  # heavy: only when a model is generating

        watch = self

        class _Watching(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                import torch

                done = [watch.update(row[prompt_length:].tolist()) for row in input_ids]
                return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

        return _Watching()


def watch_completion(
    watch: StopWatch, ids: list[int], logprobs: list[float] | None
) -> tuple[list[int], list[float] | None, str]:
    """Run `watch` over ids sampled elsewhere as a local decode would; cut them where it fires.

    For a completion sampled whole (a server, TRL's vLLM engine): the tokens after the one
    that ends it are dropped with their logprobs, so what is kept is what a local decode with
    the same watch would have sampled. The text is the watch's decoding of the ids kept, as a
    local engine's is (the caller then cuts a stop string off it). Logprobs that do not pair
    one to one with the ids are dropped, so a later check says so instead of a cut pairing
    them by accident.
    """
    paired = logprobs if logprobs is not None and len(logprobs) == len(ids) else None
    end = next((end for end in range(1, len(ids) + 1) if watch.update(ids[:end])), len(ids))
    kept = paired[:end] if paired is not None else None
    return ids[:end], kept, watch.decode(ids[:end])


@dataclass(eq=False)
class IncrementalText:
    """The text of a growing token sequence, decoding a short window per new token.

    vLLM's and TGI's incremental detokenization: the text of the tokens after `read` is the
    decode of `ids[prefix:]` less the decode of `ids[prefix:read]`, so a tokenizer that drops
    a window's leading space (SentencePiece) or merges bytes across tokens still spells it as
    the whole decode does; while the window ends inside a multi-byte character (its decode
    ends in U+FFFD) the text waits for the rest. A sequence that is not the last one extended
    is decoded afresh.

    >>> pieces = ["a", "b", "c"]
    >>> text = IncrementalText(lambda ids: "".join(pieces[i] for i in ids))
    >>> [text.update(list(range(n))) for n in (1, 2, 3)]
    ['a', 'ab', 'abc']
    """

    decode: Callable[[list[int]], str]
    _ids: list[int] = field(default_factory=list)
    _text: str = ""
    _prefix: int = 0
    _read: int = 0

    def update(self, ids: Sequence[int]) -> str:
        """Return the text of `ids`, which should extend the last sequence given."""
        known = len(self._ids)
        if len(ids) < known or list(ids[:known]) != self._ids:
            self._ids, self._text, self._prefix, self._read = [], "", 0, 0
            known = 0
        self._ids.extend(ids[known:])
        window = self._ids[self._prefix :]
        before = self.decode(window[: self._read - self._prefix]) if self._read else ""
        after = self.decode(window)
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._text += after[len(before) :]
            self._prefix, self._read = self._read, len(self._ids)
        return self._text


def _whole_json(text: str) -> bool:
    """Whether `text` opens with a complete JSON object (what follows it does not matter)."""
    if not text.lstrip().startswith("{"):
        return False
    try:
        json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError:
        return False
    return True


def cut_at_stop(text: str, stop: Sequence[str] | None) -> str:
    """Cut `text` before the earliest occurrence of any stop string."""
    ends = [text.find(s) for s in stop or () if s and s in text]
    return text[: min(ends)] if ends else text


def held_back(text: str, stop: Sequence[str]) -> int:
    """Return how many trailing characters of `text` could begin a stop string.

    A stream must hold these back: the next piece may complete the stop string, and the
    caller must never have seen its start.
    """
    longest = 0
    for s in stop:
        for size in range(min(len(s) - 1, len(text)), longest, -1):
            if text.endswith(s[:size]):
                longest = size
                break
    return longest
