"""The token-in/token-out core: prompt ids and `Sampling` in, completion ids and logprobs out.

No chat template and no LangChain here (the policies over it, `local`, render the chat). One
call decodes alone through transformers' `generate` (`sample`); calls that arrive together are
decoded together by `BatchDecoder`: a continuous batch that prompts join (a group per shared
prefix, stacked onto the running KV cache, left-padded) and finished rows leave, each row with
its own sampling settings, generator and stop watch. Either way a call gets back exactly the ids
fed and sampled, with `log_softmax(logits / temperature)` of each sampled token (temperature 1
for greedy), the distribution it was drawn from and the one training recomputes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from flowlearn.engine.draws import (
    DrawnToken,
    call_seed,
    generator,
    pick_rows,
    token_logprobs,
)
from flowlearn.engine.sampling import Generation, Sampling
from flowlearn.engine.stops import StopWatch


@dataclass(eq=False)
class ModelHandle:
    """A causal LM, its tokenizer, and the lock that serialises every call into the model.

    Policies over one model (the trained planner, its batching wrapper, the frozen base serving
    as engine with the LoRA adapter switched off) are built on one handle and so share its
    lock: the adapter switch is global to the model, so they must never run at once. The lock
    is re-entrant, so a caller may hold it around a call. Build a second policy over a model
    with `HFPolicy.on(policy.handle)`; a policy built from the bare model gets a handle, and a
    lock, of its own.
    """

    model: Any
    tokenizer: Any
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def stop_ids(self) -> set[int]:
        """Return the token ids that end a completion (the model's EOS, else the tokenizer's)."""
        eos = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        return set(eos if isinstance(eos, list) else [eos])


@runtime_checkable
class TokenModel(Protocol):
    """What the core decodes on: a model handle, the version it records, its forward scope.

    `HFPolicy` is one; a `FrozenBasePolicy`'s scope switches its LoRA adapter off.
    """

    @property
    def handle(self) -> ModelHandle:
        """The model, tokenizer and lock the calls run on."""
        ...

    @property
    def version(self) -> str:
        """The policy version recorded in every generation."""
        ...

    def forward_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Return the context the model's forwards run in (the handle's lock held)."""
        ...


@contextmanager
def only_config(model: Any, config: Any) -> Iterator[None]:
    """Make `config` the model's own generation config for one call, then restore the old one.

    `generate` fills every field a passed config leaves unset from `model.generation_config`
    (transformers 5 still merges them), so a checkpoint's `repetition_penalty`,
    `no_repeat_ngram_size`, `min_p`, `suppress_tokens`, ... would reshape sampling behind the
    logged logprobs. With `config` as the model's own, only the library's neutral defaults fill
    the gaps. PEFT copies its config onto the base model, so the base's is restored too. The
    caller holds the handle's lock; `config` carries the model's EOS, which `stop_ids` reads.
    """
    owners = [model]
    if hasattr(model, "get_base_model"):
        owners.append(model.get_base_model())
    saved = [owner.generation_config for owner in owners]
    for owner in owners:
        owner.generation_config = config
    try:
        yield
    finally:
        for owner, old in zip(owners, saved, strict=True):
            owner.generation_config = old


def sample(
    model: TokenModel,
    prompt_ids: list[int],
    sampling: Sampling,
    *,
    notes: Sequence[str] = (),
    streamer: Any = None,
    stopping: StopWatch | None = None,
) -> Generation:
    """Decode one completion of `prompt_ids` alone and return its ids and per-token logprobs.

    Args:
        model: the model to decode on, in its forward scope, holding its handle's lock.
        prompt_ids: the prompt's token ids, fed as they are.
        sampling: temperature, top_p, max_new_tokens and seed.
        notes: what the caller changed on the way (a cut prompt), kept in the generation.
        streamer: an optional transformers streamer that receives tokens as they come.
        stopping: an optional watch that ends the call early, as a `StoppingCriteria`.

    """
    import torch
    from transformers import GenerationConfig, LogitsProcessorList

    handle = model.handle
    lm, tokenizer = handle.model, handle.tokenizer
    # A sampled call draws as a batched row does (`pick_rows`, from a generator of its own), so
    # a seeded call samples the same tokens alone or in a batch, and never reseeds torch's
    # global generator. `generate` decodes greedily over the scores `DrawnToken` leaves: the
    # drawn token alone. Its `logits` stay the model's, which the logprobs are taken from.
    # `only_config` keeps the model's own config from adding processors (top_k=50, ...).
    processors = [] if sampling.temperature == 0 else [DrawnToken(sampling, lm.device)]
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=sampling.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=lm.generation_config.eos_token_id or tokenizer.eos_token_id,
        return_dict_in_generate=True,
        output_logits=True,
    )
    start = time.perf_counter()
    with handle.lock, model.forward_scope(), torch.no_grad(), only_config(lm, config):
        inputs = torch.tensor([prompt_ids], device=lm.device)
        out = lm.generate(
            input_ids=inputs,
            attention_mask=torch.ones_like(inputs),
            generation_config=config,
            logits_processor=LogitsProcessorList(processors),
            streamer=streamer,
            stopping_criteria=[stopping.criteria(len(prompt_ids))] if stopping else None,
        )
    completion = out.sequences[0, len(prompt_ids) :].tolist()
    completion = completion[: len(out.logits)]
    logprobs = token_logprobs(out.logits, completion, sampling.temperature)
    return Generation(
        text=tokenizer.decode(completion, skip_special_tokens=True),
        prompt_ids=prompt_ids,
        completion_ids=completion,
        logprobs=logprobs,
        policy_version=model.version,
        sampling=sampling.as_dict(),
        seconds=time.perf_counter() - start,
        notes=list(notes),
    )


# Batched decoding: grouping prompts (the batch's operations on the KV cache are in
# `kv_cache`, picking each row's token in `draws`), then the continuous loop over them.


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


def shared_prefix_length(prompts: list[list[int]]) -> int:
    """Return how many leading tokens all prompts share, leaving each at least one of its own."""
    first, shortest = prompts[0], min(len(p) for p in prompts)
    length = 0
    while length < shortest - 1 and all(p[length] == first[length] for p in prompts):
        length += 1
    return length


@dataclass
class DecodeStats:
    """Where a batched decoder's time went: a few clock reads per step, always on.

    The batching worker adds its waits (`idle_seconds`, `forming_seconds`) and each request's
    time in the queue; benches read the totals (`bench/rollout_speed.py`). On a GPU the forward
    only launches kernels and `pick_seconds` (which reads the chosen tokens back) waits for
    them, unless `sync` is set: then each forward is synchronised and timed whole.
    """

    prefill_seconds: float = 0.0
    """Reading arrived prompts (their KV cache) and stacking them onto the running batch."""
    prefill_rows: int = 0
    steps: int = 0
    """Decoding steps: one forward over one new token per busy row."""
    pick_seconds: float = 0.0
    """Choosing every row's next token (`pick_rows`: log-softmax, top-p, draw, read back)."""
    forward_seconds: float = 0.0
    """The model's decoding forwards."""
    host_seconds: float = 0.0
    """The rest of a step on the host: stop checks, finished rows leaving, mask growth."""
    row_steps: int = 0
    """Rows decoded, summed over steps (rows busy per step x steps)."""
    tokens: int = 0
    """Tokens chosen (every request's completion tokens)."""
    requests: int = 0
    queue_seconds: float = 0.0
    """Summed over requests: from `submit` to the start of their prefill."""
    idle_seconds: float = 0.0
    """The worker waiting for a first request, nothing being decoded."""
    forming_seconds: float = 0.0
    """The worker waiting up to `max_wait_s` for company before a new batch starts."""
    sync: bool = False
    """Synchronise the device after each forward (benches on a GPU), so it is timed whole."""

    def occupancy(self, capacity: int) -> float:
        """Return rows busy per decoding step over `capacity` (the batch's most rows)."""
        return self.row_steps / (self.steps * capacity) if self.steps and capacity else 0.0

    def as_dict(self) -> dict[str, float]:
        """Return the counters (the `sync` switch left out)."""
        values = dataclasses.asdict(self)
        values.pop("sync")
        return values


@dataclass
class Request:
    """One queued call: its prompt ids and settings, the ids sampled so far, its future."""

    prompt_ids: list[int]
    sampling: Sampling
    notes: list[str] = field(default_factory=list)
    future: Future[Generation] = field(default_factory=Future)
    generator: Any = None
    watch: StopWatch | None = None
    """Ends the request early on a stop string or a degenerate repetition (the engine's)."""
    adapter: str | None = None
    """The LoRA adapter this row decodes under, in a batch of mixed adapters (`BASE_ROW` for
    the base); None: the decoder policy's own forward scope, as for every row of its batch."""
    version: str | None = None
    """The policy version its generation records; None: the decoder policy's."""
    completion: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    started: float = 0.0
    queued: float = field(default_factory=time.perf_counter)
    """When it was submitted (`DecodeStats.queue_seconds`)."""
    seed: int = field(init=False)

    def __post_init__(self) -> None:
        self.seed = call_seed(self.sampling)  # on the caller's thread, as a single call's


@dataclass
class Running:
    """The batch being decoded: one row per request, its KV cache and next-token logits."""

    rows: list[Request]
    cache: Any
    mask: Any
    last: Any
    logits: Any


BASE_ROW = "__base__"
"""PEFT's name for a row with no adapter in a batch of mixed adapters (`adapter_names`)."""


def adapter_kwargs(rows: Sequence[Request]) -> dict[str, Any]:
    """Return the forward's `adapter_names` for rows of mixed adapters, or nothing.

    PEFT's mixed-adapter batches run each LoRA layer on each adapter's rows; rows of one
    batch under several trained nodes' adapters then decode in one forward
    (`bench/adapter_batches.py` compares it with a forward per adapter).
    """
    if all(row.adapter is None for row in rows):
        return {}
    return {"adapter_names": [row.adapter or BASE_ROW for row in rows]}


@dataclass(eq=False)
class BatchDecoder:
    """Decode requests together on `policy`'s model, holding its handle's lock per forward.

    A prefix of at least `min_shared_prefix` tokens shared by a group of prompts (the system
    prompt, the planner's instructions and tool catalogue) is read once and its KV cache
    repeated for every row of the group. Requests that name an adapter (`Request.adapter`)
    share the batch whatever their adapter: each forward names every row's (PEFT's
    `adapter_names`), and only prompts of one adapter share a prefix's KV cache.
    """

    policy: TokenModel
    min_shared_prefix: int = 32
    stats: DecodeStats = field(default_factory=DecodeStats)
    """Where the decoder's time went, accumulated over its life."""

    def admit(self, running: Running | None, arrived: list[Request]) -> Running | None:
        """Read the arrived prompts (a group per shared prefix) and stack them onto the batch.

        A request whose prompt or sampler is bad fails alone; a group whose reading fails is
        read again one request at a time, so only the culprit fails.
        """
        began = time.perf_counter()
        ready = [request for request in arrived if self._start(request)]
        if not ready:
            return running
        stats = self.stats
        stats.requests += len(ready)
        stats.prefill_rows += len(ready)
        stats.queue_seconds += sum(began - r.queued for r in ready)
        try:
            batch = self._stack(running, ready)
            if stats.sync and batch is not None and batch.logits.device.type == "cuda":
                import torch

                torch.cuda.synchronize(batch.logits.device)
            return batch
        finally:
            stats.prefill_seconds += time.perf_counter() - began

    def _stack(self, running: Running | None, ready: list[Request]) -> Running | None:
        """Prefill the ready requests, a group per shared prefix, and stack them onto `running`."""
        by_adapter: dict[str | None, list[Request]] = {}
        for request in ready:  # a prefix's KV cache is its adapter's: shared within one only
            by_adapter.setdefault(request.adapter, []).append(request)
        reads = [
            read
            for members in by_adapter.values()
            for group in prefix_groups([r.prompt_ids for r in members], self.min_shared_prefix)
            for read in self._read([members[i] for i in group])
        ]
        rows = [request for members, _ in reads for request in members]
        parts = [part for _, part in reads]
        if running is not None:
            parts.insert(0, (running.cache, running.mask, running.last, running.logits))
            rows = running.rows + rows
        if not parts:
            return running
        from flowlearn.engine.kv_cache import stack  # imports transformers

        cache, mask, last, logits = stack(parts) if len(parts) > 1 else parts[0]
        return Running(rows, cache, mask, last, logits)

    def _start(self, request: Request) -> bool:
        """Check a request and give it its generator; False when it is already done or failed."""
        model = self.policy.handle.model
        limit = getattr(model.config, "max_position_embeddings", None)
        try:
            prompt, budget = request.prompt_ids, request.sampling.max_new_tokens
            if not prompt:
                raise ValueError("empty prompt: the chat template produced no tokens")
            if limit is not None and len(prompt) + budget > limit:
                raise ValueError(
                    f"prompt of {len(prompt)} tokens + {budget} new tokens exceeds the "
                    f"model's {limit} positions; shorten the prompt or the budget"
                )
            request.generator = generator(request.seed, model.device)
        except Exception as exc:
            request.future.set_exception(exc)
            return False
        request.started = time.perf_counter()
        if budget <= 0:
            self._finish(request)
            return False
        return True

    def _read(self, members: list[Request]) -> list[tuple[list[Request], Any]]:
        """Prefill a group; if that fails, each member alone, so only the culprit fails."""
        import torch

        try:
            with self.policy.handle.lock, self.policy.forward_scope(), torch.no_grad():
                return [
                    (members, self._prefill([r.prompt_ids for r in members], members[0].adapter))
                ]
        except Exception as exc:
            if len(members) == 1:
                members[0].future.set_exception(exc)
                return []
            return [read for request in members for read in self._read([request])]

    def step(self, running: Running) -> Running | None:
        """Pick every row's next token, finish the requests that are done, decode one step."""
        import torch

        stats, began = self.stats, time.perf_counter()
        rows = running.rows
        picked = pick_rows(
            running.logits.float(), [r.sampling for r in rows], [r.generator for r in rows]
        )
        picked_at = time.perf_counter()
        stats.pick_seconds += picked_at - began
        stats.tokens += len(rows)
        stops = self.policy.handle.stop_ids()
        kept = []
        for j, (request, (token, logprob)) in enumerate(zip(rows, picked, strict=True)):
            request.completion.append(token)
            request.logprobs.append(logprob)
            if (
                token in stops
                or len(request.completion) >= request.sampling.max_new_tokens
                or (request.watch is not None and request.watch.update(request.completion))
            ):
                self._finish(request)
            else:
                kept.append(j)
        if not kept:
            stats.host_seconds += time.perf_counter() - picked_at
            return None
        model = self.policy.handle.model
        chosen = torch.tensor([token for token, _ in picked], device=model.device)
        cache, mask, last = running.cache, running.mask, running.last
        if len(kept) < len(rows):  # finished rows leave the batch: no work on them
            from flowlearn.engine.kv_cache import keep, trim_left  # imports transformers

            cache, mask, last, chosen = keep(kept, cache, mask, last, chosen)
            cache, mask = trim_left(cache, mask)
            rows = [rows[j] for j in kept]
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], 1)
        last = last + 1
        forward_at = time.perf_counter()
        with self.policy.handle.lock, self.policy.forward_scope(), torch.no_grad():
            out = model(
                input_ids=chosen.unsqueeze(1),
                attention_mask=mask,
                position_ids=last.unsqueeze(1),
                use_cache=True,
                cache=cache,
                **adapter_kwargs(rows),
            )
            if stats.sync and model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
        ended = time.perf_counter()
        stats.host_seconds += forward_at - picked_at
        stats.forward_seconds += ended - forward_at
        stats.steps += 1
        stats.row_steps += len(rows)
        return Running(rows, out.cache, mask, last, out.logits[:, -1, :])

    def _finish(self, request: Request) -> None:
        request.future.set_result(
            Generation(
                text=self.policy.handle.tokenizer.decode(
                    request.completion, skip_special_tokens=True
                ),
                prompt_ids=request.prompt_ids,
                completion_ids=request.completion,
                logprobs=request.logprobs,
                policy_version=request.version or self.policy.version,
                sampling=request.sampling.as_dict(),
                seconds=time.perf_counter() - request.started,
                notes=request.notes,
            )
        )

    def _prefill(
        self, prompts: list[list[int]], adapter: str | None = None
    ) -> tuple[Any, Any, Any, Any]:
        """Read a group of prompts; return their KV cache, mask, last positions, next logits.

        `adapter`: the group's adapter in a batch of mixed adapters (None: the scope's).

        Layout: [shared prefix][left padding][each prompt's own tail]. A prefix of at least
        `min_shared_prefix` tokens is read once and its KV repeated for every row; positions
        follow the mask, so each token sits where it would in a single call.
        """
        import torch

        from flowlearn.engine.kv_cache import appending_cache  # imports transformers

        model, tokenizer, n = self.policy.handle.model, self.policy.handle.tokenizer, len(prompts)
        device = model.device
        shared = shared_prefix_length(prompts) if n > 1 else 0
        if shared < self.min_shared_prefix:
            shared = 0
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
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
        cache = appending_cache(model.config)  # decoding steps append in place, not by copying
        named = {} if adapter is None else {"adapter_names": [adapter]}
        if shared:
            head = torch.tensor([prompts[0][:shared]], device=device)
            model(input_ids=head, use_cache=True, logits_to_keep=1, cache=cache, **named)
            cache.batch_repeat_interleave(n)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions[:, shared:],
            use_cache=True,
            logits_to_keep=1,  # the prompt's logits are never needed, only the next one's
            cache=cache,
            **({} if adapter is None else {"adapter_names": [adapter] * n}),
        )
        return out.cache, mask, positions[:, -1], out.logits[:, -1, :]
