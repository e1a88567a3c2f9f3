"""The trainer's side of TRL's loop: which piece each micro-step trains, and its loss in chunks.

The tensors (padding, pieces, the `flow_*` columns) come from `batches`; the functions here
run inside `FlowGRPOTrainer`'s `_prepare_inputs` and `compute_loss` and use TRL's trainer state.

Why it looks like this:
1. TRL's `_prepare_inputs` shuffles the generation batch and cuts it into
   `steps_per_generation` pieces; `next_piece` does the same without the shuffle, because the
   layout (`batches.step_tensors`) already shuffled the rows and placed its padding.
2. `chunked_loss` runs a piece through TRL's loss in chunks of per_device_train_batch_size
   rows, so a pass's memory does not grow with the turns of a step: every chunk but the last
   is backpropagated at once, outside DDP's gradient sync (`no_sync`), and the last chunk's
   loss goes back to `training_step`, whose backward syncs when the micro-step ends an
   accumulation window. Each chunk carries its own `num_items_in_batch` (`flow_items`), the
   same for all chunks except in `verl_like` mode.
3. An optimizer step the layout marked without a trainable token on any process (`flow_live`
   0) is skipped by every process: a zero loss that reaches no parameter, so AdamW changes
   nothing.

TRL's private state read or written here (trl==1.16.0, `trl/trainer/grpo_trainer.py`), kept
in this module so a TRL upgrade is checked in one place:
- `_step`: micro-steps taken; set to 0 in `GRPOTrainer.__init__` (line 948), incremented in
  `training_step` (line 1513). `next_piece` reads it.
- `_buffered_inputs`: the current generation batch's pieces; set to None in `__init__` (line
  951), filled in `_prepare_inputs` (line 1545). `next_piece` reads and fills it.
- `_generate_and_score_completions`: the method that builds a generation batch (line 2324),
  overridden by `FlowGRPOTrainer`. `next_piece` calls it.
- `_metrics`: `{"train": defaultdict(list), "eval": defaultdict(list)}`, set in `__init__`
  (line 1080), appended to by the loss (`_compute_loss`) and emptied by `log`. `chunked_loss`
  appends `flow/skipped_update` and copies each node's loss metrics to `flow/<node>/<metric>`.
- `num_iterations` (public): `args.num_iterations`, set in `__init__` (line 944).
Besides these: the trainer's public `model`, `args` and `accelerator`, and the flow's own
`mode` and `roles` (`FlowGRPOTrainer`).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch
from trl.trainer.utils import split_tensor_dict

from flowlearn.engine.adapters import switch_adapter

PROMPT_KEYS = ("prompt_ids", "prompt_mask")

LossOf = Callable[[dict[str, Any]], torch.Tensor]
"""TRL's loss of some rows (`GRPOTrainer.compute_loss` bound to the model)."""


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


def chunked_loss(trainer: Any, model: Any, inputs: dict[str, Any], loss_of: LossOf) -> torch.Tensor:
    """Return the piece's loss, backpropagating all chunks but the last (see the module doc)."""
    if "flow_live" in inputs and not bool(inputs["flow_live"].any()):
        trainer._metrics["train"]["flow/skipped_update"].append(1.0)
        return torch.zeros((), device=trainer.accelerator.device, requires_grad=True)
    trainer._metrics["train"]["flow/skipped_update"].append(0.0)
    size = int(trainer.args.per_device_train_batch_size)
    starts = range(0, int(inputs["completion_ids"].size(0)), size)
    parts: list[tuple[dict[str, Any], LossOf]] = []
    for start in starts:
        piece = chunk(inputs, start, start + size)
        if "flow_node" in piece:
            live = trainer.model
            parts += node_parts(
                piece,
                loss_of,
                nodes=trainer.roles.nodes,
                model=trainer.accelerator.unwrap_model(live),
                metrics=trainer._metrics["train" if live.training else "eval"],
            )
        else:
            parts.append((piece, loss_of))
    learning = model.training and torch.is_grad_enabled()
    done = torch.zeros((), device=trainer.accelerator.device)
    for piece, loss_fn in parts[:-1]:
        sync = trainer.accelerator.no_sync(model) if learning else contextlib.nullcontext()
        with sync:
            loss = loss_fn(piece)
            if learning:
                trainer.accelerator.backward(loss)
        done = done + loss.detach()
    piece, loss_fn = parts[-1]
    return loss_fn(piece) + done


def chunk(inputs: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Return rows start:stop, without the padding columns none of them uses."""
    return pick(inputs, slice(start, stop))


def pick(inputs: dict[str, Any], rows: slice | torch.Tensor) -> dict[str, Any]:
    """Return the rows `rows` selects, without the padding columns none of them uses."""
    prompt = inputs["prompt_mask"][rows].sum(0).nonzero()
    completion = inputs["completion_mask"][rows].sum(0).nonzero()
    first = int(prompt[0]) if len(prompt) else 0
    last = int(completion[-1]) + 1 if len(completion) else 1
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            value = value[rows]
            if value.ndim == 2:
                value = value[:, first:] if key in PROMPT_KEYS else value[:, :last]
        out[key] = value
    if "flow_items" in inputs:
        out["num_items_in_batch"] = out["flow_items"][0]
    return out


def node_parts(
    piece: dict[str, Any],
    loss_of: LossOf,
    *,
    nodes: Sequence[str],
    model: Any,
    metrics: defaultdict[str, list[float]],
) -> list[tuple[dict[str, Any], LossOf]]:
    """Split a chunk by its rows' nodes; each part's loss runs under its node's adapter.

    The adapter is switched on `model` (the unwrapped trained model), not scoped: the last
    part's backward runs after `compute_loss` returns (in TRL's `training_step`), and a
    recomputed forward (gradient checkpointing) must see the adapter its forward saw. Padding
    rows go with the first part. Each part's TRL metrics (in `metrics`, the mode's
    `_metrics` table) are also logged under its node (`flow/<node>/<metric>`).
    """
    index = piece["flow_node"]
    parts: list[tuple[dict[str, Any], LossOf]] = []
    present = [n for n in sorted({int(i) for i in index.tolist()}) if n >= 0] or [0]
    for k, n in enumerate(present):
        rows = (index == n) | ((index < 0) if k == 0 else torch.zeros_like(index, dtype=torch.bool))
        part = pick(piece, rows.nonzero().squeeze(1))
        parts.append((part, partial(_under, model, metrics, nodes[n], loss_of)))
    return parts


def _under(
    model: Any,
    metrics: defaultdict[str, list[float]],
    node: str,
    loss_of: LossOf,
    piece: dict[str, Any],
) -> torch.Tensor:
    """Return `loss_of(piece)` with `node`'s adapter active, its TRL metrics also as the node's."""
    switch_adapter(model, node)
    before = {key: len(values) for key, values in metrics.items()}
    loss = loss_of(piece)
    for key in [k for k in metrics if not k.startswith("flow/")]:
        for value in metrics[key][before.get(key, 0) :]:
            metrics[f"flow/{node}/{key}"].append(value)
    return loss
