"""The LoRA model with its adapter switched off: the frozen base, serving as a fixed engine."""

from __future__ import annotations

import contextlib
from typing import Any, cast

from flowlearn.nodes.policies.hf import HFPolicy
from flowlearn.nodes.policies.stops import StopWatch
from flowlearn.nodes.schema.sampling import Generation, Messages, Sampling


class FrozenBasePolicy(HFPolicy):
    """Generate with the PEFT adapter of `policy`'s model disabled.

    It is built on `policy`'s handle, so it shares that model's lock with every policy on the
    same handle: the adapter is never toggled under a running call of the trained policy,
    batched or not.
    """

    def __init__(self, policy: HFPolicy) -> None:
        """Serve the base of `policy`'s (PEFT) model, versioned `<policy version>:base`."""
        self._bind(policy.handle, f"{policy.version}:base", policy.context_window)

    def forward_scope(self) -> contextlib.AbstractContextManager[Any]:
        """Switch the adapter off (the caller holds the handle's lock)."""
        return cast("contextlib.AbstractContextManager[Any]", self.model.disable_adapter())

    def generate(
        self,
        messages: Messages,
        sampling: Sampling,
        *,
        streamer: Any = None,
        stopping: StopWatch | None = None,
    ) -> Generation:
        """Generate with the adapter disabled."""
        with self.handle.lock, self.forward_scope():
            return super().generate(messages, sampling, streamer=streamer, stopping=stopping)
