"""One policy call's generation config, with nothing of the checkpoint's own merged in."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def only_config(model: Any, config: Any) -> Iterator[None]:
    """Make `config` the model's own generation config for one call, then restore the old one.

    `generate` fills every field a passed config leaves unset from `model.generation_config`
    (transformers 5 still merges them), so a checkpoint's `repetition_penalty`,
    `no_repeat_ngram_size`, `min_p`, `suppress_tokens`, ... would reshape sampling behind the
    logged logprobs. With `config` as the model's own, only the library's neutral defaults fill
    the gaps. PEFT copies its config onto the base model, so the base's is restored too. The
    caller holds the handle's lock; `config` carries the model's EOS, which `stop_ids` reads.
    """
    owners = [model]
    if hasattr(model, "get_base_model"):
        owners.append(model.get_base_model())
    saved = [owner.generation_config for owner in owners]
    for owner in owners:
        owner.generation_config = config
    try:
        yield
    finally:
        for owner, old in zip(owners, saved, strict=True):
            owner.generation_config = old
