"""Identical greedy calls in flight at once are decoded once, and each caller gets the result.

Training runs G rollouts of a question at once, and the fixed engine is greedy: every rollout
asks it the same query analysis at the same moment, and the same executor, verifier and
generator prompts whenever the rollouts' plans agree. Greedy decoding of one prompt gives one
completion, so `BatchingPolicy` decodes such a call once (the first to arrive, the leader) and
hands a copy of its generation, and its stop watch's verdict, to the calls that joined it.
Measured with `bench/shared_calls.py` (the first round of examples/learn_tools.yaml: 2
questions x G=8, one turn, 2 CPU cores): 23 of the 64 engine calls shared, the engine's replies
the same in all 16 rollouts, rollouts 1.10x as fast (162 s against 178 s). The gain is smaller
than the calls saved, since on CPU a batch of 16 rows decodes in little more time than one of 2.

Sampled calls (temperature above 0) are never shared: each is its own draw.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from typing import Any

from flowlearn.nodes.policies.stops import StopWatch
from flowlearn.nodes.schema.sampling import Generation, Sampling


def call_key(
    prompt_ids: Sequence[int],
    sampling: Sampling,
    notes: Sequence[str],
    stopping: StopWatch | None,
) -> Hashable | None:
    """Return what makes two calls decode alike, or None for a sampled call (never shared)."""
    if sampling.temperature != 0:
        return None
    watch = (
        None
        if stopping is None
        else (stopping.stop, stopping.repetition, stopping.json_prefix, stopping.ends)
    )
    return (tuple(prompt_ids), sampling, tuple(notes), watch)


def _copy_watch(leader: StopWatch | None, follower: StopWatch | None) -> None:
    if leader is not None and follower is not None:
        follower.reason, follower.detail, follower.tokens = (
            leader.reason,
            leader.detail,
            leader.tokens,
        )


@dataclasses.dataclass(eq=False)
class SharedCalls:
    """The greedy calls being decoded, by `call_key`; `join` shares one or starts it."""

    shared: int = 0
    """How many calls were answered by another's decoding (for benches and tests)."""
    _leaders: dict[Hashable, tuple[Future[Generation], StopWatch | None]] = dataclasses.field(
        default_factory=dict
    )
    # Re-entrant: a leader that is already done runs its `_forget` callback inside `join`.
    _lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)

    def join(
        self,
        key: Hashable | None,
        stopping: StopWatch | None,
        start: Callable[[], Future[Generation]],
    ) -> Future[Generation]:
        """Return the future of an identical call in flight, else of `start()` (a new leader)."""
        if key is None:
            return start()
        with self._lock:
            found = self._leaders.get(key)
            if found is None:
                future = start()
                self._leaders[key] = (future, stopping)
                future.add_done_callback(lambda _: self._forget(key))
                return future
            self.shared += 1
        leader, leader_watch = found
        follower: Future[Generation] = Future()

        def follow(done: Future[Generation]) -> None:
            error = done.exception()
            if error is not None:
                follower.set_exception(error)
                return
            _copy_watch(leader_watch, stopping)
            generation = done.result()
            follower.set_result(
                dataclasses.replace(
                    generation,
                    prompt_ids=_copied(generation.prompt_ids),
                    completion_ids=_copied(generation.completion_ids),
                    logprobs=_copied(generation.logprobs),
                    sampling=dict(generation.sampling),
                    notes=list(generation.notes),
                )
            )

        leader.add_done_callback(follow)
        return follower

    def _forget(self, key: Hashable) -> None:
        with self._lock:
            self._leaders.pop(key, None)


def _copied(values: list[Any] | None) -> list[Any] | None:
    return None if values is None else list(values)
