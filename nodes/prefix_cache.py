"""KV caches of recently read prompt prefixes, reused across batches.

Every planner prompt starts with the same system prompt, instructions and tool catalogue, and
every verifier prompt with its own; on a CPU, reading those hundreds of tokens again for each
batch is most of the prefill. `PrefixCache` keeps the KV cache of the last few prefixes read
(batch of one) and hands out a copy of the longest match, cut to the tokens it shares with the
new prefix, so only the rest is read. Entries are dropped as soon as the model's weights change
in place (an optimizer step, `load_state_dict`): a stale cache would log logprobs of a policy
that no longer exists.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any


class PrefixCache:
    """A small LRU of prefix token tuples and their KV caches (batch of one)."""

    def __init__(self, size: int) -> None:
        """Keep at most `size` prefixes (0 keeps none: every prefix is read in full).

        Raises:
            ValueError: a negative size.

        """
        if size < 0:
            raise ValueError(f"prefix_cache_size must be >= 0, got {size}")
        self.size = size
        self.entries: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self.weights: tuple[int, int] | None = None
        self.reused_tokens = 0
        """Prompt tokens taken from the cache instead of read (for benchmarks and tests)."""

    def lookup(self, tokens: list[int], model: Any, minimum: int) -> tuple[int, Any]:
        """Return (n, cache): a fresh copy of the KV of `tokens[:n]`, or (0, None).

        A match shorter than `minimum` tokens is not worth a copy and counts as none.
        """
        if not self.size:
            return 0, None
        weights = weights_fingerprint(model)
        if weights != self.weights:
            self.entries.clear()
            self.weights = weights
        best, best_key = 0, None
        for key in self.entries:
            shared = common_length(key, tokens)
            if shared > best:
                best, best_key = shared, key
        if best_key is None or best < minimum:
            return 0, None
        self.entries.move_to_end(best_key)
        cache = copy.deepcopy(self.entries[best_key])
        for layer in cache.layers:
            layer.keys = layer.keys[..., :best, :]
            layer.values = layer.values[..., :best, :]
        self.reused_tokens += best
        return best, cache

    def store(self, tokens: list[int], cache: Any) -> None:
        """Keep a copy of `cache`, the KV of `tokens`, evicting the least recently used."""
        if not self.size:
            return
        self.entries[tuple(tokens)] = copy.deepcopy(cache)
        self.entries.move_to_end(tuple(tokens))
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)


def weights_fingerprint(model: Any) -> tuple[int, int]:
    """Identify the model's current weights: its identity and its parameters' version counters.

    Every in-place change through autograd-visible ops (optimizer steps, `load_state_dict`,
    `copy_`) bumps a parameter's `_version`. Writes through `.data` do not; code that swaps
    weights that way should make a new policy.
    """
    return id(model), sum(p._version for p in model.parameters())


def common_length(a: tuple[int, ...] | list[int], b: list[int]) -> int:
    """Return how many leading tokens `a` and `b` share."""
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length
