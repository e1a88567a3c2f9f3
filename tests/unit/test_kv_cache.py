"""AppendingLayer: appends in place, and otherwise behaves as transformers' DynamicLayer."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM
from transformers.cache_utils import DynamicCache, DynamicLayer

from flowlearn.engine import kv_cache
from flowlearn.engine.kv_cache import AppendingLayer, appending_cache


def states(batch: int, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, 2, tokens, 4), torch.randn(batch, 2, tokens, 4)


def test_appending_layer_matches_dynamic_layer_through_every_operation() -> None:
    torch.manual_seed(0)
    start = states(3, 5)
    plain, appending = DynamicLayer(), AppendingLayer()
    plain.update(*start)
    appending.update(*start)
    buffers, rows = set(), 3
    for step in range(kv_cache.SPARE + 10):  # crosses a regrowth
        new = states(rows, 1)
        expected, got = plain.update(*new), appending.update(*new)
        assert all(torch.equal(e, g) for e, g in zip(expected, got, strict=True))
        buffers.add(appending.keys.data_ptr())
        if step == 20:
            plain.batch_select_indices(torch.tensor([0, 2]))
            appending.batch_select_indices(torch.tensor([0, 2]))
            rows = 2
        if step == 40:
            plain.crop(-3)
            appending.crop(-3)
        if step == 45:  # what trimming the batch's left columns does
            for layer in (plain, appending):
                layer.keys, layer.values = layer.keys[..., 2:, :], layer.values[..., 2:, :]
    assert len(buffers) <= 6  # a few regrowths, not one copy per step
    assert appending.get_seq_length() == plain.get_seq_length()
    plain.batch_repeat_interleave(2)
    appending.batch_repeat_interleave(2)
    new = states(4, 2)
    expected, got = plain.update(*new), appending.update(*new)
    assert all(torch.equal(e, g) for e, g in zip(expected, got, strict=True))
    appending.reset()
    assert appending.get_seq_length() == 0
    again = states(1, 2)
    assert torch.equal(appending.update(*again)[0], again[0])


def test_a_models_appending_cache_gives_the_stock_caches_logits(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    cache = appending_cache(model.config)
    assert isinstance(cache, DynamicCache)
    assert cache.layers and all(type(layer) is AppendingLayer for layer in cache.layers)
    ids = torch.randint(0, 100, (2, 7))
    with torch.no_grad():
        stock = model(input_ids=ids, use_cache=True)
        ours = model(input_ids=ids, use_cache=True, cache=cache)
        for _ in range(3):
            step = stock.logits[:, -1:].argmax(-1)
            stock = model(input_ids=step, use_cache=True, cache=stock.cache)
            ours = model(input_ids=step, use_cache=True, cache=ours.cache)
            torch.testing.assert_close(ours.logits, stock.logits)
    assert ours.cache is cache and cache.get_seq_length() == 10
