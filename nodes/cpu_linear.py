"""Faster CPU generation: `nn.Linear` layers multiply by a transposed copy of their weight.

On CPU, `F.linear(x, W)` asks MKL's sgemm for `x @ W.T` with the right operand transposed;
for the few rows of a decoding step that kernel is 2 to 4 times slower than `x @ Wt` with
`Wt = W.T.contiguous()` (SmolLM2-135M's MLP at 16 rows: 1057 vs 275 us; its 49k-token head:
37 vs 19 ms; one decoding step of 16 rows: 362 vs 241 ms, on 2 cores). From about 64 rows
the two are even, and past that (reading a prompt) the stock kernel is up to 10% faster.

`TransposedLinears` keeps those copies and, while `active`, swaps the forward of every plain
fp32 `nn.Linear` of the model for that product on up to `MAX_ROWS` rows. Only under
`torch.no_grad()` (a copy carries no gradient back to the weight) and only on CPU; a copy is
remade when its weight's version counter moves (an optimizer step, `copy_` under `no_grad`),
but not when it is changed through `.data` (PEFT's `merge` does that): `clear` the copies
after such a change. The copies cost one more copy of the linear weights in memory.

`BatchingPolicy` uses it, with copies made when a worker starts decoding and freed when it
ends. A single call (`HFPolicy`) does not: at one row the gain is small (a step of 92 vs 89
ms) and not worth a copy kept between calls.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

MAX_ROWS = 64
"""Products over more rows than this (reading a prompt) use `F.linear`, as fast or faster there."""


class TransposedLinears:
    """Transposed weight copies of a model's linear layers, used while generating on CPU."""

    def __init__(self) -> None:
        self._copies: weakref.WeakKeyDictionary[Any, tuple[tuple[int, int], Any]] = (
            weakref.WeakKeyDictionary()
        )

    def clear(self) -> None:
        """Free the copies (they are made again at the next use)."""
        self._copies.clear()

    @contextmanager
    def active(self, model: Any) -> Iterator[None]:
        """Within this block, `model`'s plain fp32 linear layers multiply by the copies.

        A no-op on other devices and when gradients are enabled. Hold the model's lock: the
        swap is visible to any thread running the model meanwhile.
        """
        import torch

        if torch.is_grad_enabled() or model.device.type != "cpu":
            yield
            return
        swapped = []
        for module in model.modules():
            # exact type: subclasses (quantized, LoRA) compute differently; a forward already
            # replaced on the instance (an offloading hook) is left alone
            if (
                type(module) is torch.nn.Linear
                and module.weight.dtype == torch.float32
                and "forward" not in module.__dict__
            ):
                module.__dict__["forward"] = self._forward(module)  # on the instance only
                swapped.append(module)
        try:
            yield
        finally:
            for module in swapped:
                del module.__dict__["forward"]

    def _forward(self, module: Any) -> Callable[[Any], Any]:
        import torch.nn.functional as F

        weight, bias = module.weight, module.bias
        key = (weight.data_ptr(), weight._version)
        entry = self._copies.get(module)
        if entry is None or entry[0] != key:
            entry = self._copies[module] = (key, weight.detach().t().contiguous())
        transposed = entry[1]

        def forward(x: Any) -> Any:
            if x.numel() > MAX_ROWS * x.shape[-1]:  # reading a prompt: the stock kernel
                return F.linear(x, weight, bias)
            out = x @ transposed
            return out if bias is None else out.add_(bias)

        return forward
