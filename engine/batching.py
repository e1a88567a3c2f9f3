"""Dynamic batching: concurrent policy calls from many in-flight flows share one forward pass.

RL on agent flows spends most of its time generating. With G rollouts of Q questions in flight
(threads or asyncio), `BatchingPolicy` queues each `generate` call and decodes up to
`max_batch_size` of them together in one KV-cached loop (`BatchDecoder`), each with its own
temperature, top-p, seed, token budget, stop at EOS and stop watch (stop strings, repetition).
The loop is continuous: a request that finishes leaves the batch and returns at once, and
requests that arrive meanwhile join it at the next step. Each request gets back exactly what a
single call logs: its prompt ids, the ids it sampled and `log_softmax(logits / temperature)` of
each (temperature 1 for greedy). A request that fails (a bad prompt, a sampler that raises)
fails alone.

Identical greedy calls in flight at once are decoded once, and each caller gets the result.

Training runs G rollouts of a question at once, and the fixed engine is greedy: every rollout
asks it the same query analysis at the same moment, and the same executor, verifier and
generator prompts whenever the rollouts' plans agree. Greedy decoding of one prompt gives one
completion, so `BatchingPolicy` decodes such a call once (the first to arrive, the leader) and
hands a copy of its generation, and its stop watch's verdict, to the calls that joined it.
`bench/rollouts.py` measures what it saves apart from batching (its `batched_sharing` arm, with
the count of calls shared; docs/performance.md). The gain is smaller than the calls saved, since
on CPU a batch of many rows decodes in little more time than one of a few.

Sampled calls (temperature above 0) are never shared: each is its own draw.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, ClassVar

from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.stops import StopWatch
from flowlearn.engine.tokens import BatchDecoder, DecodeStats, ModelHandle, Request, Running

IDLE_EXIT_S = 5.0
"""A batching worker with nothing to decode for this long ends; the next call starts one."""


class _Stop(Exception):
    """The policy was closed (by `close`, or because the interpreter is exiting)."""


def _stop_worker(requests: queue.Queue[Request | None], worker: threading.Thread) -> None:
    """End `worker` now: run by `close`, and by `weakref.finalize` at interpreter exit.

    A daemon thread that wakes from its timed wait while the interpreter is being torn down is
    killed inside native code, which aborts the process ("terminate called without an active
    exception") and turns a clean exit into a crash.
    """
    if worker.is_alive() and worker is not threading.current_thread():
        requests.put(None)
        worker.join(timeout=2.0)


def check_batching(max_batch_size: int, max_wait_s: float) -> None:
    """Refuse a batch size below 1 or a negative wait (any batching policy's settings)."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
    if max_wait_s < 0:
        raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")


def call_key(
    prompt_ids: Sequence[int],
    sampling: Sampling,
    notes: Sequence[str],
    stopping: StopWatch | None,
    adapter: str | None = None,
    version: str | None = None,
) -> Hashable | None:
    """Return what makes two calls decode alike, or None for a sampled call (never shared)."""
    if sampling.temperature != 0:
        return None
    watch = (
        None
        if stopping is None
        else (stopping.stop, stopping.repetition, stopping.json_prefix, stopping.ends)
    )
    return (tuple(prompt_ids), sampling, tuple(notes), watch, adapter, version)


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


@dataclass(eq=False)
class BatchingPolicy:
    """Wrap an `HFPolicy` so that concurrent calls are decoded together.

    It shares the wrapped policy's handle (model, tokenizer and lock) and version, and streams
    (which needs one sequence) through the wrapped policy alone. Its worker thread starts with
    the first call, ends after `IDLE_EXIT_S` idle, on `close`, and at interpreter exit.

    Attributes:
        wrapped: the single-call policy whose model decodes the batches.
        max_batch_size: the most requests decoded together.
        max_wait_s: how long the first request of a batch waits for company.
        min_shared_prefix: when a group of prompts shares at least this many leading tokens,
            that prefix is read once and its KV cache shared by every row of the group.
        share_greedy_calls: a greedy call identical to one in flight gets a copy of its
            result instead of a row of its own (`SharedCalls`; bench/rollouts.py measures it).
        continuous: requests join the running batch at the next decoding step. False decodes
            a static batch, as `generate` does: calls that arrive while a batch runs wait until
            its every row is done (bench/rollout_speed.py measures what continuity gives).

    """

    continues_prefill: ClassVar[bool] = True
    """A final assistant message is continued, as the chat template renders it."""

    wrapped: HFPolicy
    max_batch_size: int = 16
    max_wait_s: float = 0.05
    min_shared_prefix: int = 32
    share_greedy_calls: bool = True
    continuous: bool = True
    _decoder: BatchDecoder = field(init=False, repr=False)
    _queue: queue.Queue[Request | None] = field(init=False, repr=False)
    _worker: threading.Thread | None = field(init=False, repr=False, default=None)
    _stopper: weakref.finalize[Any, Any] | None = field(init=False, repr=False, default=None)
    _start_lock: threading.Lock = field(init=False, repr=False)
    shared_calls: SharedCalls = field(init=False, repr=False, default_factory=SharedCalls)
    """Identical greedy calls in flight, decoded once (`SharedCalls`)."""

    def __post_init__(self) -> None:
        """Check the settings.

        Raises:
            ValueError: a batch size below 1 or a negative wait.

        """
        check_batching(self.max_batch_size, self.max_wait_s)
        self._decoder = BatchDecoder(self.wrapped, self.min_shared_prefix)
        self._queue = queue.Queue()  # None: stop
        self._start_lock = threading.Lock()

    @property
    def stats(self) -> DecodeStats:
        """Where the batching worker's time went (prefill, decoding, waits), over its life."""
        return self._decoder.stats

    @property
    def handle(self) -> ModelHandle:
        """The wrapped policy's model handle."""
        return self.wrapped.handle

    @property
    def version(self) -> str:
        """The wrapped policy's version, recorded in every transition."""
        return self.wrapped.version

    def encode_chat(self, messages: Messages) -> list[int]:
        """Render `messages` with the chat template and return the prompt's token ids."""
        return self.wrapped.encode_chat(messages)

    def forward_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Return the wrapped policy's forward scope (a base policy's adapter switch)."""
        return self.wrapped.forward_scope()

    def generate(
        self,
        messages: Messages,
        sampling: Sampling,
        *,
        streamer: Any = None,
        stopping: StopWatch | None = None,
    ) -> Generation:
        """Queue one call and block until its batch is decoded; streaming calls run alone.

        A `stopping` watch is checked after each of the call's tokens and ends its row alone.
        """
        if streamer is not None:
            return self.wrapped.generate(messages, sampling, streamer=streamer, stopping=stopping)
        prompt_ids, notes = self.wrapped.fit_prompt(
            self.encode_chat(messages), sampling.max_new_tokens
        )
        return self.submit(prompt_ids, sampling, notes, stopping=stopping).result()

    def submit(
        self,
        prompt_ids: list[int],
        sampling: Sampling,
        notes: Sequence[str] = (),
        *,
        stopping: StopWatch | None = None,
        adapter: str | None = None,
        version: str | None = None,
    ) -> Future[Generation]:
        """Queue a prompt given as token ids; its future resolves when it is decoded.

        An unseeded sampled request draws its seed here, on the caller's thread, from torch's
        global generator, so calls submitted in a fixed order sample repeatably. A greedy call
        identical to one in flight shares its decoding (`SharedCalls`). `adapter` decodes the
        row under that LoRA adapter in a batch of mixed adapters (`tokens.BASE_ROW`: none),
        recording `version` (`engine.adapters.AdapterBatching`).
        """

        def start() -> Future[Generation]:
            request = Request(
                list(prompt_ids),
                sampling,
                list(notes),
                watch=stopping,
                adapter=adapter,
                version=version,
            )
            self._queue.put(request)
            self._ensure_worker()
            return request.future

        key = (
            call_key(prompt_ids, sampling, notes, stopping, adapter, version)
            if self.share_greedy_calls
            else None
        )
        return self.shared_calls.join(key, stopping, start)

    def close(self) -> None:
        """Stop the worker now; requests being decoded fail. The next call starts a new one."""
        with self._start_lock:
            stopper = self._stopper
        if stopper is not None:
            stopper()

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = worker = threading.Thread(
                    target=self._serve, name="flowlearn-batching", daemon=True
                )
                worker.start()
                self._stopper = weakref.finalize(self, _stop_worker, self._queue, worker)

    def _idle_exit(self) -> bool:
        """End the worker unless a call was queued meanwhile (True: it ends)."""
        with self._start_lock:
            if not self._queue.empty():
                return False
            self._worker = None
            if self._stopper is not None:
                self._stopper.detach()
                self._stopper = None
            return True

    def _serve(self) -> None:
        """Decode until idle for `IDLE_EXIT_S` or stopped (the next call starts a new worker)."""
        running: Running | None = None
        while True:
            arrived: list[Request] = []
            try:
                arrived = self._arrivals(running)
            except queue.Empty:
                if self._idle_exit():
                    return
                continue
            except _Stop:
                closed = RuntimeError("the batching policy was closed (or the interpreter exits)")
                for request in running.rows if running else []:
                    request.future.set_exception(closed)
                running = None
                if self._idle_exit():
                    return
                continue  # calls queued after the stop are served
            try:
                if arrived:
                    running = self._decoder.admit(running, arrived)
                if running is not None:
                    running = self._decoder.step(running)
            except Exception as exc:  # a step that fails for every row fails them all
                for request in (running.rows if running else []) + arrived:
                    if not request.future.done():
                        request.future.set_exception(exc)
                running = None

    def _arrivals(self, running: Running | None) -> list[Request]:
        """Take the requests that join: wait for the first when idle, else only what's queued.

        Raises:
            queue.Empty: idle, and nothing came for `IDLE_EXIT_S`.
            _Stop: the policy was closed.

        """
        room = self.max_batch_size - (len(running.rows) if running else 0)
        arrived: list[Request] = []
        if running is not None and not self.continuous:
            return arrived  # a static batch: the queued calls wait for the next one

        def take(item: Request | None) -> None:
            if item is None:
                for request in arrived:
                    request.future.set_exception(RuntimeError("the batching policy was closed"))
                raise _Stop
            arrived.append(item)

        if running is None:
            stats, began = self.stats, time.perf_counter()
            try:
                take(self._queue.get(timeout=IDLE_EXIT_S))
            finally:
                stats.idle_seconds += time.perf_counter() - began
            first = time.perf_counter()
            deadline = first + self.max_wait_s
            while len(arrived) < room:
                try:
                    take(self._queue.get(timeout=max(0.0, deadline - time.perf_counter())))
                except queue.Empty:
                    break
            stats.forming_seconds += time.perf_counter() - first
            return arrived
        while len(arrived) < room:
            try:
                take(self._queue.get_nowait())
            except queue.Empty:
                break
        return arrived
