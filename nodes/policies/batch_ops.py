"""Tensor operations of batched decoding: prefix groups, stacking and trimming caches, sampling.

Every function here works on plain tensors and transformers' `DynamicCache` through its public
`layers[i].keys` / `.values`, `batch_select_indices` and `batch_repeat_interleave`.
"""

from __future__ import annotations

from typing import Any

from flowlearn.nodes.schema.sampling import Sampling


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


def stack(groups: list[tuple[Any, Any, Any, Any]]) -> tuple[Any, Any, Any, Any]:
    """Join the groups' (cache, mask, last positions, logits) into one batch, left-padded."""
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


def generator(seed: int, device: Any) -> Any:
    """Return a torch generator of its own for one request, seeded with `seed`."""
    import torch

    return torch.Generator(device=device).manual_seed(seed)


def keep(rows: list[int], cache: Any, *tensors: Any) -> tuple[Any, ...]:
    """Keep only `rows` of the KV cache and of each per-row tensor."""
    import torch

    index = torch.tensor(rows, device=tensors[0].device)
    cache.batch_select_indices(index)
    return (cache, *(t[index] for t in tensors))


def trim_left(cache: Any, mask: Any) -> tuple[Any, Any]:
    """Drop the leading columns that no row attends to any more (left by rows that left)."""
    used = mask.any(0)
    start = int(used.int().argmax())
    if start == 0:
        return cache, mask
    for layer in cache.layers:
        layer.keys = layer.keys[..., start:, :]
        layer.values = layer.values[..., start:, :]
    return cache, mask[:, start:]


def pick_rows(
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
