"""Micro-batching: a generation batch in pieces (micro-steps), a piece in chunks (passes).

Why it looks like this:
1. TRL's `_prepare_inputs` shuffles the generation batch and cuts it into
   `steps_per_generation` pieces; `next_piece` does the same without the shuffle, because the
   layout (`flowlearn.training.layout`) already shuffled the rows and placed its padding.
2. `chunked_loss` runs a piece through TRL's loss in chunks of per_device_train_batch_size
   rows: every chunk but the last is backpropagated at once, outside DDP's gradient sync
   (`no_sync`), and the last chunk's loss goes back to `training_step`, whose backward syncs
   when the micro-step ends an accumulation window. Each chunk carries its own
   `num_items_in_batch` (`flow_items`), the same for all chunks except in `verl_like` mode.
3. An optimizer step without a trainable token on any process is skipped by every process
   (the layout's `flow_live`): a loss that reaches no parameter, so AdamW changes nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from trl.trainer.utils import split_tensor_dict

PROMPT_KEYS = ("prompt_ids", "prompt_mask")


def next_piece(trainer: Any, generation_batch: Any) -> dict[str, Any]:
    """Return the current micro-step's piece, generating a new batch every generate_every."""
    if not trainer.model.training:
        batch: dict[str, Any] = trainer._generate_and_score_completions(generation_batch)
        return batch
    if trainer.mode == "verl_like" and trainer.args.delta is None:
        raise ValueError(
            "mode 'verl_like' clips as verl does (dual clip, clip_ratio_c 3): set delta=3.0, "
            "TRL's name for it (FlowGRPOConfig sets it for mode verl_like)"
        )
    pieces = int(trainer.args.steps_per_generation)
    generate_every = pieces * trainer.num_iterations
    if trainer._step % generate_every == 0 or trainer._buffered_inputs is None:
        output = trainer._generate_and_score_completions(generation_batch)
        trainer._buffered_inputs = split_tensor_dict(output, pieces)
    piece: dict[str, Any] = trainer._buffered_inputs[trainer._step % pieces]
    return piece


def chunk(inputs: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Return rows start:stop, without the padding columns none of them uses."""
    prompt = inputs["prompt_mask"][start:stop].sum(0).nonzero()
    completion = inputs["completion_mask"][start:stop].sum(0).nonzero()
    first = int(prompt[0]) if len(prompt) else 0
    last = int(completion[-1]) + 1 if len(completion) else 1
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            value = value[start:stop]
            if value.ndim == 2:
                value = value[:, first:] if key in PROMPT_KEYS else value[:, :last]
        out[key] = value
    if "flow_items" in inputs:
        out["num_items_in_batch"] = inputs["flow_items"][start]
    return out


def chunked_loss(
    trainer: Any,
    model: Any,
    inputs: dict[str, Any],
    loss_of: Callable[[dict[str, Any]], torch.Tensor],
) -> torch.Tensor:
    """Return the piece's loss, backpropagating all chunks but the last (see the module doc)."""
    if "flow_live" in inputs and not bool(inputs["flow_live"].any()):
        trainer._metrics["train"]["flow/skipped_update"].append(1.0)
        return torch.zeros((), device=trainer.accelerator.device, requires_grad=True)
    trainer._metrics["train"]["flow/skipped_update"].append(0.0)
    size = int(trainer.args.per_device_train_batch_size)
    starts = list(range(0, int(inputs["completion_ids"].size(0)), size))
    learning = model.training and torch.is_grad_enabled()
    done = torch.zeros((), device=trainer.accelerator.device)
    for start in starts[:-1]:
        sync = trainer.accelerator.no_sync(model) if learning else contextlib.nullcontext()
        with sync:
            loss = loss_of(chunk(inputs, start, start + size))
            if learning:
                trainer.accelerator.backward(loss)
        done = done + loss.detach()
    return loss_of(chunk(inputs, starts[-1], starts[-1] + size)) + done
