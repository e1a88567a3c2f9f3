"""The handle on one loaded model: what every policy over that model shares."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class ModelHandle:
    """A causal LM, its tokenizer, and the lock that serialises every call into the model.

    Policies over one model (the trained planner, its batching wrapper, the frozen base serving
    as engine with the LoRA adapter switched off) are built on one handle and so share its
    lock: the adapter switch is global to the model, so they must never run at once. The lock
    is re-entrant, because `FrozenBasePolicy` holds it around `generate`. Build a second policy
    over a model with `HFPolicy.on(policy.handle)`; a policy built from the bare model gets a
    handle, and a lock, of its own.
    """

    model: Any
    tokenizer: Any
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def stop_ids(self) -> set[int]:
        """Return the token ids that end a completion (the model's EOS, else the tokenizer's)."""
        eos = self.model.generation_config.eos_token_id or self.tokenizer.eos_token_id
        return set(eos if isinstance(eos, list) else [eos])
