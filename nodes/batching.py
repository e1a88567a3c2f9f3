"""Dynamic batching: concurrent policy calls from many in-flight flows share one forward pass.

RL on agent flows spends most of its time generating. With G rollouts of Q questions in flight
(threads or asyncio), `BatchingPolicy` queues each `generate` call, waits at most `max_wait_s`
for others, and decodes up to `max_batch_size` of them together: prompts left-padded, one
KV-cached decoding loop, and for every request its own temperature, top-p, seed, token budget
and stop at EOS. Each request gets back exactly what a single call logs: its prompt ids, the
ids it sampled and `log_softmax(logits / temperature)` of each (temperature 1 for greedy).
A request that fails (say, a bad token id) fails alone: a batch that
raises is retried one request at a time.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from flowlearn.nodes.hf_policy import HFPolicy
from flowlearn.nodes.policy import Generation, Messages, Sampling


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: Sampling
    notes: list[str] = field(default_factory=list)
    future: Future[Generation] = field(default_factory=Future)


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
    ) -> None:
        """Wrap `policy` (its model, tokenizer, version and lock are shared).

        Args:
            policy: the single-call policy whose model decodes the batches.
            max_batch_size: the most requests decoded together.
            max_wait_s: how long the first request of a batch waits for company.
            min_shared_prefix: when the batch's prompts share at least this many leading
                tokens (the system prompt, the planner's instructions and tool catalogue),
                that prefix is read once and its KV cache shared by every row.

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
        self._queue: queue.Queue[_Request] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()
        self.batch_sizes: list[int] = []
        """Sizes of the batches decoded so far (for benchmarks and tests)."""

    def generate(
        self, messages: Messages, sampling: Sampling, *, streamer: Any = None
    ) -> Generation:
        """Queue one call and block until its batch is decoded; streaming calls run alone."""
        if streamer is not None:
            return self.policy.generate(messages, sampling, streamer=streamer)
        prompt_ids, notes = self.fit_prompt(self.encode_chat(messages), sampling.max_new_tokens)
        request = _Request(prompt_ids, sampling, notes)
        self._ensure_worker()
        self._queue.put(request)
        return request.future.result()

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(
                    target=self._serve, name="flowlearn-batching", daemon=True
                )
                self._worker.start()

    def _serve(self) -> None:
        while True:
            batch = [self._queue.get()]
            deadline = time.perf_counter() + self.max_wait_s
            while len(batch) < self.max_batch_size:
                try:
                    batch.append(self._queue.get(timeout=max(0.0, deadline - time.perf_counter())))
                except queue.Empty:
                    break
            self._run(batch)

    def _run(self, batch: list[_Request]) -> None:
        start = time.perf_counter()
        try:
            results = self.decode([r.prompt_ids for r in batch], [r.sampling for r in batch])
        except Exception as exc:
            if len(batch) == 1:
                batch[0].future.set_exception(exc)
                return
            for request in batch:  # find the culprit: only it fails
                self._run([request])
            return
        self.batch_sizes.append(len(batch))
        seconds = time.perf_counter() - start
        for request, (completion, logprobs) in zip(batch, results, strict=True):
            request.future.set_result(
                Generation(
                    text=self.tokenizer.decode(completion, skip_special_tokens=True),
                    prompt_ids=request.prompt_ids,
                    completion_ids=completion,
                    logprobs=logprobs,
                    policy_version=self.version,
                    sampling=request.sampling.as_dict(),
                    seconds=seconds,
                    notes=request.notes,
                )
            )

    def decode(
        self, prompts: list[list[int]], samplings: list[Sampling]
    ) -> list[tuple[list[int], list[float]]]:
        """Decode several prompts together; return each one's completion ids and logprobs."""
        import torch

        model = self.model
        limit = getattr(model.config, "max_position_embeddings", None)
        for prompt, sampling in zip(prompts, samplings, strict=True):
            if not prompt:
                raise ValueError("empty prompt: the chat template produced no tokens")
            if limit is not None and len(prompt) + sampling.max_new_tokens > limit:
                raise ValueError(
                    f"prompt of {len(prompt)} tokens + {sampling.max_new_tokens} new tokens "
                    f"exceeds the model's {limit} positions; shorten the prompt or the budget"
                )
        eos = model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        stops = set(eos if isinstance(eos, list) else [eos])
        device = model.device
        generators = [_generator(s.seed, device) for s in samplings]
        completions: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        done = [s.max_new_tokens <= 0 for s in samplings]
        with self._lock, torch.no_grad():
            # Prompts of one kind (the planner's, the verifier's, ...) share a long prefix and
            # similar lengths: each kind is read as its own group, then all decode together.
            groups = prefix_groups(prompts, self.min_shared_prefix)
            read = [self._prefill([prompts[i] for i in group]) for group in groups]
            rows = [i for group in groups for i in group]  # the request of each batch row
            past, mask, last, logits = _stack(read) if len(read) > 1 else read[0]
            keep = [j for j, i in enumerate(rows) if not done[i]]
            if len(keep) < len(rows):
                past, mask, last, logits = _keep(keep, past, mask, last, logits)
                rows = [rows[j] for j in keep]
            while rows:
                picked = _pick_rows(logits.float(), [samplings[i] for i in rows], generators, rows)
                for i, (token, logprob) in zip(rows, picked, strict=True):
                    completions[i].append(token)
                    logprobs[i].append(logprob)
                    done[i] = token in stops or len(completions[i]) >= samplings[i].max_new_tokens
                chosen = torch.tensor([token for token, _ in picked], device=device)
                keep = [j for j, i in enumerate(rows) if not done[i]]
                if not keep:
                    break
                if len(keep) < len(rows):  # finished rows leave the batch: no work on them
                    past, mask, last, chosen = _keep(keep, past, mask, last, chosen)
                    rows = [rows[j] for j in keep]
                mask = torch.cat([mask, mask.new_ones((len(rows), 1))], 1)
                last = last + 1
                out = model(
                    input_ids=chosen.unsqueeze(1),
                    attention_mask=mask,
                    position_ids=last.unsqueeze(1),
                    use_cache=True,
                    cache=past,
                )
                past, logits = out.cache, out.logits[:, -1, :]
        return list(zip(completions, logprobs, strict=True))

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, Any, Any, Any]:
        """Read a group of prompts; return their KV cache, mask, last positions, next logits.

        Layout: [shared prefix][left padding][each prompt's own tail]. A prefix of at least
        `min_shared_prefix` tokens is read once and its cache repeated for every row; positions
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


def _generator(seed: int | None, device: Any) -> Any:
    import torch

    generator = torch.Generator(device=device)
    if seed is not None:
        generator.manual_seed(seed)
    else:
        generator.seed()
    return generator


def _keep(rows: list[int], cache: Any, *tensors: Any) -> tuple[Any, ...]:
    """Keep only `rows` of the KV cache and of each per-row tensor."""
    import torch

    index = torch.tensor(rows, device=tensors[0].device)
    cache.batch_select_indices(index)
    return (cache, *(t[index] for t in tensors))


def _pick_rows(
    logits: Any, samplings: list[Sampling], generators: list[Any], rows: list[int]
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
            [torch.rand(1, generator=generators[rows[j]], device=logits.device) for j in sampled]
        )
        chosen = torch.searchsorted(cdf, (draws * cdf[:, -1]).unsqueeze(1), right=True)
        tokens[index] = chosen.squeeze(1).clamp(max=probs.shape[1] - 1)
    picked = scaled.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return list(zip(tokens.tolist(), picked.tolist(), strict=True))
