"""The engine's input and output: sampling settings in, a generation (ids and logprobs) out."""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, replace
from typing import Any

Messages = list[dict[str, str]]
"""Chat messages as plain `{"role": ..., "content": ...}` dicts, the form transitions store."""


MAX_TEMPERATURE = 10.0
"""The highest sampling temperature accepted; above it a model samples noise."""
MAX_NEW_TOKENS = 131_072
"""The most tokens one call may be asked for."""
MAX_LOGPROB = 1e-4
"""The largest logprob accepted. A log-probability is at most 0; a hair above is float rounding
(fp32 `log_softmax` over logits of magnitude 30 is off by a few 1e-6, bf16 and a top-p
renormalisation by more), and changes a ratio by at most 0.01%. Anything above is not a
log-probability: a ratio taken from it trains on nothing (+3 gave loss 0 and no update)."""
MIN_LOGPROB = -1000.0
"""The smallest logprob accepted: a sampled token's probability is above the smallest float
(e^-104 in fp32, e^-745 in fp64); -1e308 would overflow every ratio taken from it."""


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


CALL_DEADLINE: ContextVar[float | None] = ContextVar("flowlearn_call_deadline", default=None)
"""When the running node's model calls must end (a `time.time()` value), or None: the run's
`max_seconds` budget, set around each node (`nodes.render.within_run_budget`). A served call
(`ServerPolicy`) whose `Sampling.deadline` is None honours it, so the engine's calls and a
trained node's end with the run's budget as the planner's do."""


@contextmanager
def calls_until(deadline: float | None) -> Iterator[None]:
    """Make `deadline` the `CALL_DEADLINE` of the model calls made inside the block."""
    token = CALL_DEADLINE.set(deadline)
    try:
        yield
    finally:
        CALL_DEADLINE.reset(token)


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Sampling settings for one policy call; its defaults are the planner's (`Context`'s).

    Greedy by default, as AgentFlow's inference: a run, an eval and the Python API then answer
    the same way twice. Rollouts that train need variety and say so: `flowlearn collect`
    samples at 0.7, and training at TRL's `temperature`.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int | None = None
    deadline: float | None = field(default=None, compare=False)
    """The wall-clock time (`time.time()`) by which the call must be over, or None (the
    backend's own limit). A served policy ends its request there (`ServerPolicy`); a local one
    is bounded by `max_new_tokens` and ignores it. Neither compared nor recorded: it limits
    the call, it does not change what is sampled."""

    def __post_init__(self) -> None:
        # NaN compares false with everything: each check is written so that it fails NaN
        if not _number(self.temperature) or not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(
                f"temperature must be a finite number in [0, {MAX_TEMPERATURE:g}] (0 means "
                f"greedy), got {self.temperature!r}"
            )
        if not _number(self.top_p) or not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if (
            not isinstance(self.max_new_tokens, int)
            or isinstance(self.max_new_tokens, bool)
            or not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS
        ):
            raise ValueError(
                f"max_new_tokens must be a whole number in [1, {MAX_NEW_TOKENS}], "
                f"got {self.max_new_tokens!r}"
            )
        if self.seed is not None and (
            not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, bool)
        ):
            raise ValueError(f"seed must be a whole number or None, got {self.seed!r}")
        if self.deadline is not None and not _number(self.deadline):
            raise ValueError(f"deadline must be a finite time.time() value, got {self.deadline!r}")

    def as_dict(self) -> dict[str, Any]:
        """Return the sampling settings as a JSON-serializable dict (the deadline left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "deadline"}

    def for_call(self, *keys: object) -> Sampling:
        """Return these settings for one call, with a set seed turned into the call's own.

        One seed handed to every call made every call draw the same uniforms: under
        `flowlearn eval --seed 1` (T=0.7, the default then) the untrained planner searched for
        1 of 24 lookups, one correlated draw rather than one per case. The call's seed is a hash
        of the run's seed and `keys` (the question and the turn), so a seeded run is
        reproducible whatever the order calls finish in, and each question and turn draws on
        its own. Unseeded settings come back unchanged (the policy draws from torch's generator).
        """
        if self.seed is None:
            return self
        key = repr((int(self.seed), *keys)).encode()  # 1, True and numpy's 1 alike
        digest = hashlib.blake2b(key, digest_size=8).digest()
        return replace(self, seed=int.from_bytes(digest, "big") >> 2)  # below 2**62


@dataclass(kw_only=True)
class Generation:
    """What one policy call produced: the policy's half of a `Transition`.

    The node that made the call adds `node`, `turn` and `parse_status`
    (`flowlearn.nodes.policy_transition`); the fields below pass into the transition unchanged.

    `prompt_ids`, `completion_ids` and `logprobs` are the exact tokens fed and sampled, with the
    log-probability of each sampled token under the sampling distribution actually used (after
    temperature). They are `None` when the backend cannot provide them (a chat-model adapter).
    """

    text: str
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    """What the backend changed on the way, e.g. a prompt cut to fit the model's window."""

    @property
    def token_faithful(self) -> bool:
        """Whether this generation carries the token ids and logprobs training needs."""
        return token_faithful(vars(self))


def token_faithful(record: Mapping[str, Any]) -> bool:
    """Whether a transition (or generation) carries the ids and logprobs training needs.

    The one rule: prompt ids present, completion ids present, one logprob per completion token.
    """
    prompt, completion, logprobs = (
        record.get("prompt_ids"),
        record.get("completion_ids"),
        record.get("logprobs"),
    )
    return (
        bool(prompt)
        and completion is not None
        and logprobs is not None
        and (len(logprobs) == len(completion))
    )


def token_problem(record: Mapping[str, Any], vocab_size: int | None = None) -> str | None:
    """Return `field = value (why)` for the first token id or logprob training must not use.

    The one rule for every place ids and logprobs arrive or are read back (a server's reply, a
    trajectory file, the rows of a step): ids are whole numbers (not bools) in
    `[0, vocab_size)`, or `>= 0` when the vocabulary is not known here; logprobs are finite
    real numbers in `[MIN_LOGPROB, MAX_LOGPROB]`. An id past the vocabulary crashed training with an
    `IndexError`; positive logprobs trained on nothing and still saved a policy. None when
    every one present is fine (absent fields are `token_faithful`'s concern).

    >>> token_problem({"completion_ids": [3, -5], "logprobs": [-0.1, -0.2]})
    'completion_ids[1] = -5 (a negative token id)'
    >>> token_problem({"completion_ids": [3], "logprobs": [3.0]}, vocab_size=400)
    'logprobs[0] = 3.0 (above 0: not a log-probability)'
    """
    for name in ("prompt_ids", "completion_ids"):
        ids = record.get(name)
        if ids is None:
            continue
        if not isinstance(ids, list):
            return f"{name} = {_brief(ids)} (not a list of token ids)"
        # the builtins scan in C: a store's thousands of prompt ids are checked fast
        if all(type(i) is int for i in ids) and (
            not ids or (min(ids) >= 0 and (vocab_size is None or max(ids) < vocab_size))
        ):
            continue
        for k, value in enumerate(ids):
            if type(value) is not int:
                return f"{name}[{k}] = {_brief(value)} (not a whole number)"
            if value < 0:
                return f"{name}[{k}] = {value} (a negative token id)"
            if vocab_size is not None and value >= vocab_size:
                return f"{name}[{k}] = {value} (outside the vocabulary of {vocab_size} tokens)"
    logprobs = record.get("logprobs")
    if logprobs is None:
        return None
    if not isinstance(logprobs, list):
        return f"logprobs = {_brief(logprobs)} (not a list of numbers)"
    for k, value in enumerate(logprobs):
        if not _number(value):
            return f"logprobs[{k}] = {_brief(value)} (not a finite number)"
        if value > MAX_LOGPROB:
            return f"logprobs[{k}] = {value!r} (above 0: not a log-probability)"
        if value < MIN_LOGPROB:
            return f"logprobs[{k}] = {value!r} (below {MIN_LOGPROB:g}: no sampled token's)"
    return None


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
