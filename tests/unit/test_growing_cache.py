"""GrowingLayer: appends in place, and otherwise behaves as transformers' DynamicLayer."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from flowlearn.nodes import growing_cache
from flowlearn.nodes.growing_cache import GrowingLayer, grow_in_place


def states(batch: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 2, tokens, 4), torch.randn(batch, 2, tokens, 4)


def test_growing_layer_matches_dynamic_layer_through_every_operation() -> None:
    torch.manual_seed(0)
    start = states(3, 5)
    plain, growing = DynamicLayer(), GrowingLayer(*start)
    plain.update(*start)
    buffers, rows = set(), 3
    for step in range(growing_cache.SPARE + 10):  # crosses a regrowth
        new = states(rows, 1)
        expected, got = plain.update(*new), growing.update(*new)
        assert all(torch.equal(e, g) for e, g in zip(expected, got, strict=True))
        buffers.add(growing._keys.data_ptr())
        if step == 20:
            plain.batch_select_indices(torch.tensor([0, 2]))
            growing.batch_select_indices(torch.tensor([0, 2]))
            rows = 2
        if step == 40:
            plain.crop(-3)
            growing.crop(-3)
    assert len(buffers) <= 4  # a few regrowths, not one copy per step
    assert growing.get_seq_length() == plain.get_seq_length()
    plain.batch_repeat_interleave(2)
    growing.batch_repeat_interleave(2)
    new = states(4, 2)
    expected, got = plain.update(*new), growing.update(*new)
    assert all(torch.equal(e, g) for e, g in zip(expected, got, strict=True))
    growing.reset()
    assert growing.get_seq_length() == 0
    again = states(1, 2)
    assert torch.equal(growing.update(*again)[0], again[0])


def test_grow_in_place_converts_a_models_cache() -> None:
    cache = DynamicCache()
    cache.update(*states(2, 3), layer_idx=0)
    cache.update(*states(2, 3), layer_idx=1)
    keys = cache.layers[0].keys.clone()
    grow_in_place(cache)
    assert all(type(layer) is GrowingLayer for layer in cache.layers)
    assert torch.equal(cache.layers[0].keys, keys)
    assert cache.get_seq_length() == 3
