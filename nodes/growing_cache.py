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


class GrowingLayer(DynamicLayer):  # type: ignore[no-untyped-call]
    """A `DynamicLayer` whose appends write into spare room instead of concatenating."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold `keys` and `values` (batch, heads, tokens, dim); room is added on first append."""
        super().__init__()  # type: ignore[no-untyped-call]
        self.device = keys.device
        self.is_initialized = True
        self.keys = keys
        self.values = values

    @property
    def keys(self) -> torch.Tensor | None:
        """The cached keys: the filled part of the buffer."""
        return None if self._keys is None else self._keys[..., : self.length, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._keys = value
        self.length = 0 if value is None else value.shape[-2]

    @property
    def values(self) -> torch.Tensor | None:
        """The cached values: the filled part of the buffer."""
        return None if self._values is None else self._values[..., : self._values_length, :]

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._values = value
        self._values_length = 0 if value is None else value.shape[-2]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this step's keys and values in place; return the whole cache."""
        if self._keys is None or self._values is None:  # emptied by reset()
            self.device, self.is_initialized = key_states.device, True
            self.keys, self.values = key_states[..., :0, :], value_states[..., :0, :]
        assert self._keys is not None and self._values is not None
        start, added = self.length, key_states.shape[-2]
        if start + added > self._keys.shape[-2] or start + added > self._values.shape[-2]:
            room = start + added + max(SPARE, (start + added) // 2)
            self._keys = _grown(self._keys, start, room)
            self._values = _grown(self._values, start, room)
        self._keys[..., start : start + added, :] = key_states
        self._values[..., start : start + added, :] = value_states
        self.length = self._values_length = start + added
        return self._keys[..., : self.length, :], self._values[..., : self.length, :]


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
