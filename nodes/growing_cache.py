"""A KV cache layer that appends in place, so a decoding step does not copy the whole cache.

transformers' `DynamicLayer` appends each step's keys and values with `torch.cat`, which copies
the layer's entire cache: with 16 rows of 500 tokens that is most of a CPU decoding step's time
after the matmuls. `GrowingLayer` keeps the same tensors inside a buffer with spare room at the
end and writes each step's token there; only when the room runs out is the buffer copied, into
one half as large again. Everything else (`keys`, `values`, crop, batch select, repeat) behaves
as `DynamicLayer`'s, because `keys` and `values` are views of the buffer's filled part and
assigning them replaces the buffer.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

SPARE = 64
"""Room added beyond what is needed when a buffer has to grow (at least)."""


class _Filled:
    """A view of the filled part of a layer's buffer; assigning a tensor replaces the buffer.

    For `keys` it reads `_keys` up to `_keys_length`; each of keys and values keeps its own
    length because `DynamicLayer`'s methods reassign them one after the other.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.buffer, self.filled = f"_{name}", f"_{name}_length"

    def __get__(self, layer: Any, owner: type | None = None) -> Any:
        buffer = getattr(layer, self.buffer)
        return None if buffer is None else buffer[..., : getattr(layer, self.filled), :]

    def __set__(self, layer: Any, value: torch.Tensor | None) -> None:
        setattr(layer, self.buffer, value)
        setattr(layer, self.filled, 0 if value is None else value.shape[-2])


class GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A `DynamicLayer` whose appends write into spare room instead of concatenating."""

    keys = _Filled()
    values = _Filled()
    _keys: torch.Tensor | None
    _values: torch.Tensor | None
    _keys_length: int
    _values_length: int

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold `keys` and `values` (batch, heads, tokens, dim); room is added on first append."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.device = keys.device
        self.is_initialized = True
        self.keys = keys
        self.values = values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys and values in place; return the whole cache."""
        if self._keys is None or self._values is None:  # emptied by reset()
            self.device, self.is_initialized = key_states.device, True
            self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]
        assert self._keys is not None and self._values is not None
        start, end = self._keys_length, self._keys_length + key_states.shape[-2]
        if end > self._keys.shape[-2] or end > self._values.shape[-2]:
            room = end + max(SPARE, end // 2)
            self._keys = _grown(self._keys, start, room)
            self._values = _grown(self._values, start, room)
        self._keys[..., start:end, :] = key_states
        self._values[..., start:end, :] = value_states
        self._keys_length = self._values_length = end
        return self._keys[..., :end, :], self._values[..., :end, :]


def _grown(buffer: torch.Tensor, filled: int, room: int) -> torch.Tensor:
    """Return a new buffer of `room` tokens holding the first `filled` of `buffer`."""
    shape = (*buffer.shape[:-2], room, buffer.shape[-1])
    grown = buffer.new_empty(shape)
    grown[..., :filled, :] = buffer[..., :filled, :]
    return grown


def grow_in_place(cache: Any) -> Any:
    """Turn the cache's plain `DynamicLayer`s into `GrowingLayer`s (others are left alone)."""
    for index, layer in enumerate(cache.layers):
        keys, values = layer.keys, layer.values
        if type(layer) is DynamicLayer and keys is not None and values is not None:
            cache.layers[index] = GrowingLayer(keys, values)
    return cache
