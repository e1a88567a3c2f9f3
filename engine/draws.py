"""How a call's tokens are drawn, alone or as a row of a batch, and their logprobs.

Every sampled call draws from a torch generator of its own, seeded with the call's seed (or one
drawn from torch's global generator), by inverse CDF over its tempered, top-p-cut
distribution: so a seeded call samples the same tokens alone (`DrawnToken`, inside
`generate`) or in a batch (`pick_rows`), whatever else shares that batch.
"""

from __future__ import annotations

from typing import Any

from flowlearn.engine.sampling import Sampling


def generator(seed: int, device: Any) -> Any:
    """Return a torch generator of its own for one request, seeded with `seed`."""
    import torch

    return torch.Generator(device=device).manual_seed(seed)


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


class DrawnToken:
    """A logits processor that draws a single call's next token as `pick_rows` draws a row's.

    It leaves the drawn token the only one possible, so `generate`'s greedy choice takes it.
    """

    def __init__(self, sampling: Sampling, device: Any) -> None:
        self.sampling = sampling
        self.generator = generator(call_seed(sampling), device)

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        """Return scores that leave only the drawn token possible."""
        import torch

        [(token, _)] = pick_rows(scores[:1].float(), [self.sampling], [self.generator])
        drawn = torch.full_like(scores, float("-inf"))
        drawn[:, token] = 0.0
        return drawn


def call_seed(sampling: Sampling) -> int:
    """Return the seed a call draws with.

    Its own, else one drawn from torch's global generator on the caller's thread, so
    `transformers.set_seed` (TRL's `args.seed`) governs it.
    """
    import torch

    if sampling.seed is not None or sampling.temperature == 0:
        return sampling.seed or 0  # greedy never draws
    return int(torch.randint(0, 2**62, ()).item())


def token_logprobs(logits: Any, token_ids: list[int], temperature: float) -> list[float]:
    """Return log p(token) under `log_softmax(logits / temperature)` for each step's token.

    `logits` are per-step raw logits, (1, vocab) tensors or one (steps, vocab) tensor; greedy
    (temperature 0) is scored at temperature 1.
    """
    import torch

    if not token_ids:
        return []
    stacked = torch.stack([row.reshape(-1) for row in logits[: len(token_ids)]]).float()
    scaled = stacked / (temperature if temperature > 0 else 1.0)
    chosen = torch.tensor(token_ids, device=scaled.device).unsqueeze(1)
    picked = torch.log_softmax(scaled, dim=-1).gather(1, chosen).squeeze(1)
    return [float(x) for x in picked.tolist()]
