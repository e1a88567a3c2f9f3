"""The continuous batched decoding loop: prompts join a running batch, finished rows leave it.

`BatchDecoder` reads arrived prompts (a group per shared prefix, then stacked onto the running
KV cache, left-padded), picks each row's next token with its own sampling settings and
generator, ends a row at EOS, at its budget or when its stop watch fires, and returns each
finished request's `Generation`, exactly what a single call logs.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from flowlearn.nodes.policies import batch_ops
from flowlearn.nodes.policies.hf import HFPolicy
from flowlearn.nodes.policies.stops import StopWatch
from flowlearn.nodes.schema.sampling import Generation, Sampling


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
class Running:
    """The batch being decoded: one row per request, its KV cache and next-token logits."""

    rows: list[Request]
    cache: Any
    mask: Any
    last: Any
    logits: Any


@dataclass(eq=False)
class BatchDecoder:
    """Decode requests together on `policy`'s model, holding its handle's lock per forward.

    A prefix of at least `min_shared_prefix` tokens shared by a group of prompts (the system
    prompt, the planner's instructions and tool catalogue) is read once and its KV cache
    repeated for every row of the group.
    """

    policy: HFPolicy
    min_shared_prefix: int = 32

    def admit(self, running: Running | None, arrived: list[Request]) -> Running | None:
        """Read the arrived prompts (a group per shared prefix) and stack them onto the batch.

        A request whose prompt or sampler is bad fails alone; a group whose reading fails is
        read again one request at a time, so only the culprit fails.
        """
        ready = [request for request in arrived if self._start(request)]
        if not ready:
            return running
        groups = batch_ops.prefix_groups([r.prompt_ids for r in ready], self.min_shared_prefix)
        reads = [read for group in groups for read in self._read([ready[i] for i in group])]
        rows = [request for members, _ in reads for request in members]
        parts = [part for _, part in reads]
        if running is not None:
            parts.insert(0, (running.cache, running.mask, running.last, running.logits))
            rows = running.rows + rows
        if not parts:
            return running
        cache, mask, last, logits = batch_ops.stack(parts) if len(parts) > 1 else parts[0]
        return Running(rows, cache, mask, last, logits)

    def _start(self, request: Request) -> bool:
        """Check a request and give it its generator; False when it is already done or failed."""
        model = self.policy.model
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
            request.generator = batch_ops.generator(request.seed, model.device)
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
                return [(members, self._prefill([r.prompt_ids for r in members]))]
        except Exception as exc:
            if len(members) == 1:
                members[0].future.set_exception(exc)
                return []
            return [read for request in members for read in self._read([request])]

    def step(self, running: Running) -> Running | None:
        """Pick every row's next token, finish the requests that are done, decode one step."""
        import torch

        rows = running.rows
        picked = batch_ops.pick_rows(
            running.logits.float(), [r.sampling for r in rows], [r.generator for r in rows]
        )
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
            return None
        model = self.policy.model
        chosen = torch.tensor([token for token, _ in picked], device=model.device)
        cache, mask, last = running.cache, running.mask, running.last
        if len(kept) < len(rows):  # finished rows leave the batch: no work on them
            cache, mask, last, chosen = batch_ops.keep(kept, cache, mask, last, chosen)
            cache, mask = batch_ops.trim_left(cache, mask)
            rows = [rows[j] for j in kept]
        mask = torch.cat([mask, mask.new_ones((len(rows), 1))], 1)
        last = last + 1
        with self.policy.handle.lock, self.policy.forward_scope(), torch.no_grad():
            out = model(
                input_ids=chosen.unsqueeze(1),
                attention_mask=mask,
                position_ids=last.unsqueeze(1),
                use_cache=True,
                cache=cache,
            )
        return Running(rows, out.cache, mask, last, out.logits[:, -1, :])

    def _finish(self, request: Request) -> None:
        request.future.set_result(
            Generation(
                text=self.policy.tokenizer.decode(request.completion, skip_special_tokens=True),
                prompt_ids=request.prompt_ids,
                completion_ids=request.completion,
                logprobs=request.logprobs,
                policy_version=self.policy.version,
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

        from flowlearn.nodes.policies.kv_cache import appending_cache  # imports transformers

        model, tokenizer, n = self.policy.model, self.policy.tokenizer, len(prompts)
        device = model.device
        shared = batch_ops.shared_prefix_length(prompts) if n > 1 else 0
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
        if shared:
            head = torch.tensor([prompts[0][:shared]], device=device)
            model(input_ids=head, use_cache=True, logits_to_keep=1, cache=cache)
            cache.batch_repeat_interleave(n)
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions[:, shared:],
            use_cache=True,
            logits_to_keep=1,  # the prompt's logits are never needed, only the next one's
            cache=cache,
        )
        return out.cache, mask, positions[:, -1], out.logits[:, -1, :]
