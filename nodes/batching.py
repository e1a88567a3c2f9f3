"""Dynamic batching: concurrent policy calls from many in-flight flows share one forward pass.

RL on agent flows spends most of its time generating. With G rollouts of Q questions in flight
(threads or asyncio), `BatchingPolicy` queues each `generate` call and decodes up to
`max_batch_size` of them together in one KV-cached loop, each with its own temperature, top-p,
seed, token budget and stop at EOS. The loop is continuous: a request that finishes leaves the
batch and returns at once, and requests that arrive meanwhile join it at the next step (read
as groups of prompts that share a prefix, then stacked onto the running cache, left-padded).
Each request gets back exactly what a single call logs: its prompt ids, the ids it sampled
and `log_softmax(logits / temperature)` of each (temperature 1 for greedy). A request that
fails (a bad prompt, a sampler that raises) fails alone.
"""

from __future__ import annotations

import atexit
import queue
import threading
import time
import weakref
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from flowlearn.nodes.cpu_linear import TransposedLinears
from flowlearn.nodes.hf_policy import HFPolicy
from flowlearn.nodes.schema.sampling import Generation, Messages, Sampling

IDLE_EXIT_S = 5.0
"""A batching worker with nothing to decode for this long ends; the next call starts one."""

_SERVING: weakref.WeakSet[BatchingPolicy] = weakref.WeakSet()


class _Stop(Exception):
    """The interpreter is exiting: the worker ends now."""


@atexit.register
def _stop_workers() -> None:
    """End every batching worker before the interpreter finalizes.

    A daemon thread that wakes from its timed wait while the interpreter is being torn down is
    killed inside native code, which aborts the process ("terminate called without an active
    exception") and turns a clean exit into a crash.
    """
    workers = []
    for policy in list(_SERVING):
        worker = policy._worker
        if worker is not None and worker.is_alive():
            policy._queue.put(None)
            workers.append(worker)
    for worker in workers:
        worker.join(timeout=2.0)


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: Sampling
    notes: list[str] = field(default_factory=list)
    future: Future[Generation] = field(default_factory=Future)
    generator: Any = None
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    started: float = 0.0
    seed: int = field(init=False)

    def __post_init__(self) -> None:
        # An unseeded request draws its seed from torch's global generator, on the caller's
        # thread, so `transformers.set_seed` (and TRL's `args.seed`) governs batched sampling
        # as it governs a single `generate` call.
        if self.sampling.seed is not None or self.sampling.temperature == 0:
            self.seed = self.sampling.seed or 0  # greedy never draws
        else:
            import torch

            self.seed = int(torch.randint(0, 2**62, ()).item())


@dataclass
class _Running:
    """The batch being decoded: one row per request, its KV cache and next-token logits."""

    rows: list[_Request]
    cache: Any
    mask: Any
    last: Any
    logits: Any


class BatchingPolicy(HFPolicy):
    """An `HFPolicy` that coalesces concurrent calls into batched decoding.

    It is an `HFPolicy` over the same model and tokenizer (so `HFChatModel` takes it as its
    backend), holds the model's lock like every policy over it, and streams (which needs one
    sequence) alone.
    """

    def __init__(
        self,
        policy: HFPolicy,
        *,
        max_batch_size: int = 16,
        max_wait_s: float = 0.05,
        min_shared_prefix: int = 32,
        transposed_cpu_weights: bool = True,
    ) -> None:
        """Wrap `policy` (its model, tokenizer, version and lock are shared).

        Args:
            policy: the single-call policy whose model decodes the batches.
            max_batch_size: the most requests decoded together.
            max_wait_s: how long the first request of a batch waits for company.
            min_shared_prefix: when the batch's prompts share at least this many leading
                tokens (the system prompt, the planner's instructions and tool catalogue),
                that prefix is read once and its KV cache shared by every row.
            transposed_cpu_weights: on CPU, decode with transposed copies of the fp32 linear
                weights (`TransposedLinears`): a 16-row step of SmolLM2-135M takes 241 ms
                instead of 362 ms, for one more copy of those weights in memory while a worker
                runs. The copies are made when a worker starts decoding and freed when it ends;
                meanwhile a weight changed in place is copied again only if its version counter
                moves (optimizer steps, `copy_` under `no_grad`), not through `.data`.

        Raises:
            ValueError: a batch size below 1 or a negative wait.

        """
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        super().__init__(
            policy.model,
            policy.tokenizer,
            version=policy.version,
            context_window=policy.context_window,
        )
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.min_shared_prefix = min_shared_prefix
        self._linears = TransposedLinears() if transposed_cpu_weights else None
        self._queue: queue.Queue[_Request | None] = queue.Queue()  # None: stop
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.batch_sizes: list[int] = []
        """Rows in each forward pass over the running batch (for benchmarks and tests)."""
        self.seconds = {"reading": 0.0, "decoding": 0.0}
        """Worker time spent reading prompts and decoding steps (for benchmarks)."""

    def generate(
        self, messages: Messages, sampling: Sampling, *, streamer: Any = None
    ) -> Generation:
        """Queue one call and block until its batch is decoded; streaming calls run alone."""
        if streamer is not None:
            return self.policy.generate(messages, sampling, streamer=streamer)
        prompt_ids, notes = self.fit_prompt(self.encode_chat(messages), sampling.max_new_tokens)
        request = _Request(prompt_ids, sampling, notes)
        self._queue.put(request)
        self._ensure_worker()
        return request.future.result()

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(
                    target=self._serve, name="flowlearn-batching", daemon=True
                )
                self._worker.start()
                _SERVING.add(self)

    def _serve(self) -> None:
        """Decode until idle for `IDLE_EXIT_S`, then end (the next call starts a new worker)."""
        running: _Running | None = None
        while True:
            try:
                arrived = self._arrivals(running)
            except queue.Empty:
                with self._start_lock:  # a call queued before this check keeps the worker
                    if self._queue.empty():
                        self._worker = None
                        self._drop_weight_copies()
                        return
                continue
            except _Stop:
                for request in running.rows if running else []:
                    request.future.set_exception(RuntimeError("the interpreter is exiting"))
                return
            try:
                if arrived:
                    started = time.perf_counter()
                    running = self._admit(running, arrived)
                    self.seconds["reading"] += time.perf_counter() - started
                if running is not None:
                    started = time.perf_counter()
                    running = self._step(running)
                    self.seconds["decoding"] += time.perf_counter() - started
            except Exception as exc:  # a step that fails for every row fails them all
                for request in (running.rows if running else []) + arrived:
                    if not request.future.done():
                        request.future.set_exception(exc)
                running = None

    def _arrivals(self, running: _Running | None) -> list[_Request]:
        """Take the requests that join: wait for the first when idle, else only what's queued.

        Raises:
            queue.Empty: idle, and nothing came for `IDLE_EXIT_S`.
            _Stop: the interpreter is exiting.

        """
        room = self.max_batch_size - (len(running.rows) if running else 0)
        arrived: list[_Request] = []

        def take(item: _Request | None) -> None:
            if item is None:
                for request in arrived:
                    request.future.set_exception(RuntimeError("the interpreter is exiting"))
                raise _Stop
            arrived.append(item)

        if running is None:
            take(self._queue.get(timeout=IDLE_EXIT_S))
            deadline = time.perf_counter() + self.max_wait_s
            while len(arrived) < room:
                try:
                    take(self._queue.get(timeout=max(0.0, deadline - time.perf_counter())))
                except queue.Empty:
                    break
            return arrived
        while len(arrived) < room:
            try:
                take(self._queue.get_nowait())
            except queue.Empty:
                break
        return arrived

    def decode(
        self, prompts: list[list[int]], samplings: list[Sampling]
    ) -> list[tuple[list[int], list[float]]]:
        """Decode several prompts together; return each one's completion ids and logprobs.

        Raises the first failed request's error.
        """
        requests = [_Request(p, s) for p, s in zip(prompts, samplings, strict=True)]
        try:
            running = self._admit(None, requests)
            while running is not None:
                running = self._step(running)
        finally:
            self._drop_weight_copies()
        results = [r.future.result() for r in requests]
        return [(g.completion_ids or [], g.logprobs or []) for g in results]

    def _admit(self, running: _Running | None, arrived: list[_Request]) -> _Running | None:
        """Read the arrived prompts (a group per shared prefix) and stack them onto the batch.

        A request whose prompt or sampler is bad fails alone; a group whose reading fails is
        read again one request at a time, so only the culprit fails.
        """
        limit = getattr(self.model.config, "max_position_embeddings", None)
        ready = []
        for request in arrived:
            try:
                prompt, budget = request.prompt_ids, request.sampling.max_new_tokens
                if not prompt:
                    raise ValueError("empty prompt: the chat template produced no tokens")
                if limit is not None and len(prompt) + budget > limit:
                    raise ValueError(
                        f"prompt of {len(prompt)} tokens + {budget} new tokens exceeds the "
                        f"model's {limit} positions; shorten the prompt or the budget"
                    )
                request.generator = _generator(request.seed, self.model.device)
            except Exception as exc:
                request.future.set_exception(exc)
                continue
            request.started = time.perf_counter()
            if budget <= 0:
                self._finish(request)
            else:
                ready.append(request)
        if not ready:
            return running
        groups = prefix_groups([r.prompt_ids for r in ready], self.min_shared_prefix)
        reads = [read for group in groups for read in self._read([ready[i] for i in group])]
        rows = [request for members, _ in reads for request in members]
        parts = [part for _, part in reads]
        if running is not None:
            parts.insert(0, (running.cache, running.mask, running.last, running.logits))
            rows = running.rows + rows
        if not parts:
            return running
        cache, mask, last, logits = _stack(parts) if len(parts) > 1 else parts[0]
        from flowlearn.nodes.growing_cache import grow_in_place  # imports torch

        grow_in_place(cache)  # decoding steps append in place, not by copying the cache
        self.batch_sizes.append(len(rows))
        return _Running(rows, cache, mask, last, logits)

    def _read(self, members: list[_Request]) -> list[tuple[list[_Request], Any]]:
        """Prefill a group; if that fails, each member alone, so only the culprit fails."""
        import torch

        try:
            with self._lock, torch.no_grad(), self._fast_linears():
                return [(members, self._prefill([r.prompt_ids for r in members]))]
        except Exception as exc:
            if len(members) == 1:
                members[0].future.set_exception(exc)
                return []
            return [read for request in members for read in self._read([request])]

    def _step(self, running: _Running) -> _Running | None:
        """Pick every row's next token, return the finished requests, decode one step."""
        import torch

        rows = running.rows
        picked = _pick_rows(
            running.logits.float(), [r.sampling for r in rows], [r.generator for r in rows]
        )
        stops = self._stops()
        keep = []
        for j, (request, (token, logprob)) in enumerate(zip(rows, picked, strict=True)):
            request.completion.append(token)
            request.logprobs.append(logprob)
            if token in stops or len(request.completion) >= request.sampling.max_new_tokens:
                self._finish(request)
            else:
                keep.append(j)
        if not keep:
            return None
        chosen = torch.tensor([token for token, _ in picked], device=self.model.device)
        cache, mask, last = running.cache, running.mask, running.last
        if len(keep) < len(rows):  # finished rows leave the batch: no work on them
            cache, mask, last, chosen = _keep(keep, cache, mask, last, chosen)
            cache, mask = _trim_left(cache, mask)
            rows = [rows[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], 1)
        last = last + 1
        self.batch_sizes.append(len(rows))
        with self._lock, torch.no_grad(), self._fast_linears():
            out = self.model(
                input_ids=chosen.unsqueeze(1),
                attention_mask=mask,
                position_ids=last.unsqueeze(1),
                use_cache=True,
                cache=cache,
            )
        return _Running(rows, out.cache, mask, last, out.logits[:, -1, :])

    def _fast_linears(self) -> AbstractContextManager[None]:
        return nullcontext() if self._linears is None else self._linears.active(self.model)

    def _drop_weight_copies(self) -> None:
        if self._linears is not None:
            self._linears.clear()

    def _stops(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        return set(eos if isinstance(eos, list) else [eos])

    def _finish(self, request: _Request) -> None:
        request.future.set_result(
            Generation(
                text=self.tokenizer.decode(request.completion, skip_special_tokens=True),
                prompt_ids=request.prompt_ids,
                completion_ids=request.completion,
                logprobs=request.logprobs,
                policy_version=self.version,
                sampling=request.sampling.as_dict(),
                seconds=time.perf_counter() - request.started,
                notes=request.notes,
            )
        )

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, Any, Any, Any]:
        """Read a group of prompts; return their KV cache, mask, last positions, next logits.

        Layout: [shared prefix][left padding][each prompt's own tail]. A prefix of at least
        `min_shared_prefix` tokens is read once and its KV repeated for every row; positions
        follow the mask, so each token sits where it would in a single call.
        """
        import torch

        model, device, n = self.model, self.model.device, len(prompts)
        shared = shared_prefix_length(prompts) if n > 1 else 0
        if shared < self.min_shared_prefix:
            shared = 0
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        width = max(len(p) for p in prompts) - shared
        ids = torch.full((n, width), pad, dtype=torch.long)
        mask = torch.zeros((n, shared + width), dtype=torch.long)
        mask[:, :shared] = 1
        for i, prompt in enumerate(prompts):
            tail = prompt[shared:]
            ids[i, width - len(tail) :] = torch.tensor(tail)
            mask[i, shared + width - len(tail) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        prefix: dict[str, Any] = {}
        if shared:
            head = torch.tensor([prompts[0][:shared]], device=device)
            cache = model(input_ids=head, use_cache=True, logits_to_keep=1).cache
            cache.batch_repeat_interleave(n)
            prefix = {"cache": cache}
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions[:, shared:],
            use_cache=True,
            logits_to_keep=1,  # the prompt's logits are never needed, only the next one's
            **prefix,
        )
        return out.cache, mask, positions[:, -1], out.logits[:, -1, :]


def prefix_groups(prompts: list[list[int]], min_shared_prefix: int) -> list[list[int]]:
    """Group prompt indices so that each group's prompts share `min_shared_prefix` tokens.

    Sorted by their tokens, prompts with long common prefixes sit next to each other; a group
    ends where the next prompt shares less than `min_shared_prefix` tokens with it.
    """
    order = sorted(range(len(prompts)), key=lambda i: prompts[i])
    groups = [[order[0]]]
    for i in order[1:]:
        if shared_prefix_length([prompts[groups[-1][0]], prompts[i]]) >= min_shared_prefix:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _stack(groups: list[tuple[Any, Any, Any, Any]]) -> tuple[Any, Any, Any, Any]:
    """Join the groups' caches and masks into one batch, left-padded to the longest."""
    import torch
    import torch.nn.functional as F

    width = max(mask.shape[1] for _, mask, _, _ in groups)
    cache = groups[0][0]
    for index, layer in enumerate(cache.layers):
        for name in ("keys", "values"):
            padded = [
                F.pad(getattr(c.layers[index], name), (0, 0, width - m.shape[1], 0))
                for c, m, _, _ in groups
            ]
            setattr(layer, name, torch.cat(padded))
    mask = torch.cat([F.pad(m, (width - m.shape[1], 0)) for _, m, _, _ in groups])
    last = torch.cat([last for _, _, last, _ in groups])
    return cache, mask, last, torch.cat([logits for _, _, _, logits in groups])


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Return how many leading tokens all prompts share, leaving each at least one of its own."""
    first, shortest = prompts[0], min(len(p) for p in prompts)
    length = 0
    while length < shortest - 1 and all(p[length] == first[length] for p in prompts):
        length += 1
    return length


def _generator(seed: int, device: Any) -> Any:
    import torch

    return torch.Generator(device=device).manual_seed(seed)


def _keep(rows: list[int], cache: Any, *tensors: Any) -> tuple[Any, ...]:
    """Keep only `rows` of the KV cache and of each per-row tensor."""
    import torch

    index = torch.tensor(rows, device=tensors[0].device)
    cache.batch_select_indices(index)
    return (cache, *(t[index] for t in tensors))


def _trim_left(cache: Any, mask: Any) -> tuple[Any, Any]:
    """Drop the leading columns that no row attends to any more (left by rows that left)."""
    used = mask.any(0)
    start = int(used.int().argmax())
    if start == 0:
        return cache, mask
    for layer in cache.layers:
        layer.keys = layer.keys[..., start:, :]
        layer.values = layer.values[..., start:, :]
    return cache, mask[:, start:]


def _pick_rows(
    logits: Any, samplings: list[Sampling], generators: list[Any]
) -> list[tuple[int, float]]:
    """Choose one token per row as the single-call policy would, with its logprob.

    All rows are scored in one `log_softmax` (temperature 0 is scored at 1); sampled rows draw
    by inverse CDF from one uniform of their own generator, so a seeded request samples the
    same tokens whatever shares its batch. Top-p truncates the tail before the draw; the
    logprob stays the full distribution's.
    """
    import torch

    temperatures = torch.tensor(
        [s.temperature if s.temperature > 0 else 1.0 for s in samplings], device=logits.device
    )
    scaled = torch.log_softmax(logits / temperatures.unsqueeze(1), -1)
    tokens = scaled.argmax(-1)
    sampled = [j for j, s in enumerate(samplings) if s.temperature > 0]
    if sampled:
        index = torch.tensor(sampled, device=logits.device)
        probs = scaled[index].exp()
        top_p = torch.tensor([samplings[j].top_p for j in sampled], device=logits.device)
        if bool((top_p < 1.0).any()):
            ordered, order = torch.sort(probs, descending=True, dim=-1)
            outside = ordered.cumsum(-1) - ordered > top_p.unsqueeze(1)
            probs = probs.scatter(1, order, ordered.masked_fill(outside, 0.0))
        cdf = probs.cumsum(-1)
        draws = torch.cat(
            [torch.rand(1, generator=generators[j], device=logits.device) for j in sampled]
        )
        chosen = torch.searchsorted(cdf, (draws * cdf[:, -1]).unsqueeze(1), right=True)
        tokens[index] = chosen.squeeze(1).clamp(max=probs.shape[1] - 1)
    picked = scaled.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return list(zip(tokens.tolist(), picked.tolist(), strict=True))
