"""Batch tensors: a step's Flow-GRPO rows padded for TRL, in pieces (micro-steps) and chunks.

The batching rule: TRL's data loader hands each process `per_device_train_batch_size x
steps_per_generation` prompts per generation batch; for the flow that is questions_per_step x
num_generations rollouts (G per question). Their rows (one per planner turn, so a varying
number) are trained in `steps_per_generation` micro-steps (pieces), `gradient_accumulation_steps`
of them per optimizer step: one update per generation batch (the paper) when the two are equal,
several (the official code's mini-batches) when steps_per_generation is a multiple. A piece's
rows go through the model at most per_device_train_batch_size at a time (chunks).

Why it looks like this:
1. TRL's `dapo` loss of one micro-step is `sum(per_token_loss * mask) / D` with
   `D = num_items_in_batch / num_processes * gradient_accumulation_steps / steps_per_generation`,
   backpropagated as is, and DDP averages the processes' gradients. Under `accelerate launch`
   each process builds rows from its own questions, so the weights come from the counts of all
   processes together (Q questions for `paper`, rows for `sequence`, tokens for the KL mean),
   gathered once per generation batch, and every process passes the same global token count:
   the update is then exactly the one a single process makes on the union of the rows.
2. A step's row count varies (one row per planner turn) while TRL cuts a generation batch into
   `steps_per_generation` equal pieces, and every process must run as many forward passes as
   the others (TRL's loss gathers metrics, DDP all-reduces in the last backward). So every
   process pads its rows with weightless rows to one count, a multiple of steps_per_generation
   x per_device_train_batch_size; the real rows are shuffled (as TRL shuffles) and spread
   evenly over the pieces, the padding at the end of each piece.
3. `verl_like` follows verl v0.5.0 (which the official code pins), `dp_actor.update_policy`:
   a chunk is one of its micro-batches, whose loss is the token mean over the chunk's own
   tokens divided by the micro-batches of an update; that is one normaliser per chunk.
4. An optimizer step without a trainable token on any process is marked for every process
   (the layout's `flow_live` 0), and the trainer skips it (`loop.chunked_loss`): a loss that
   reaches no parameter, so AdamW changes nothing.
5. This module takes rows and returns tensors. Which piece a micro-step trains and the loss in
   chunks read and write TRL's trainer state, so they are the trainer's code (`loop`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flowlearn.training.rows import FlowGRPORow, weight_count

VERL_DUAL_CLIP = 3.0
"""verl v0.5.0's `clip_ratio_c`, which the official code keeps: for a negative advantage the
loss is capped at -A x 3. TRL's `delta` caps the ratio at 3 for both signs, the same loss
whenever 1 + epsilon_high < 3 (a positive advantage's ratio is clipped lower already)."""

Gather = Callable[[torch.Tensor], torch.Tensor]
"""All processes' copies of a 1-d tensor, concatenated (`Accelerator.gather`)."""


def resolve_batching(
    rollouts: int, per_device: int | None, steps: int | None, accumulation: int
) -> tuple[int, int]:
    """Return `(per_device_train_batch_size, steps_per_generation)` for `rollouts` per process.

    Unset, the per-device batch is the rollouts of one micro-step, and steps_per_generation is
    gradient_accumulation_steps (TRL's default: one update per generation batch).

    Raises:
        ValueError: the rollouts do not split evenly, the split leaves open whether it means
            accumulation or several updates, or an update would span two generation batches.

    """
    if per_device is None:
        steps = steps or accumulation
        if rollouts % steps:
            raise ValueError(
                f"the {rollouts} rollouts a process trains per step (questions_per_step x "
                f"num_generations) do not split into {steps} micro-steps (steps_per_generation, "
                f"default gradient_accumulation_steps={accumulation})"
            )
        per_device = rollouts // steps
    elif per_device < 1 or rollouts % per_device:
        raise ValueError(
            f"per_device_train_batch_size={per_device} does not divide the {rollouts} rollouts "
            "a process trains per step (questions_per_step x num_generations)"
        )
    micro = rollouts // per_device
    if steps is None and micro != accumulation:
        raise ValueError(
            f"per_device_train_batch_size={per_device} splits the {rollouts} rollouts of a step "
            f"into {micro} micro-steps: set gradient_accumulation_steps={micro} for one update "
            f"per step (the paper), or steps_per_generation={micro} for {micro} // "
            "gradient_accumulation_steps updates (the official code's mini-batches)"
        )
    steps = micro if steps is None else steps
    if steps != micro:
        raise ValueError(
            f"steps_per_generation={steps} x per_device_train_batch_size={per_device} is not "
            f"the {rollouts} rollouts a process trains per step"
        )
    check_updates(steps, accumulation)
    return per_device, steps


def check_updates(steps: int, accumulation: int) -> None:
    """Refuse an update that would span two generation batches (or part of one)."""
    if accumulation < 1 or steps % accumulation:
        raise ValueError(
            f"steps_per_generation={steps} is not a multiple of gradient_accumulation_steps="
            f"{accumulation}: an update must not span two generation batches"
        )


def check_trainer_batching(args: Any) -> None:
    """Refuse a `GRPOConfig` whose batching the trainer cannot honour."""
    check_updates(int(args.steps_per_generation or 1), int(args.gradient_accumulation_steps))


@dataclass(frozen=True)
class Batching:
    """How one generation batch is trained: by how many processes, in which pieces."""

    processes: int
    """Processes training together (`accelerate launch`), each with its own questions."""
    pieces: int
    """TRL's steps_per_generation: micro-steps per generation batch."""
    accumulation: int
    """gradient_accumulation_steps: micro-steps per optimizer step."""
    chunk_rows: int
    """per_device_train_batch_size: the most rows one forward and backward pass takes."""

    @classmethod
    def of(cls, args: Any, processes: int) -> Batching:
        """Read the batching of a `GRPOConfig` trained by `processes` processes."""
        return cls(
            processes=processes,
            pieces=int(args.steps_per_generation or 1),
            accumulation=int(args.gradient_accumulation_steps or 1),
            chunk_rows=int(args.per_device_train_batch_size),
        )

    def padded(self, most: int) -> int:
        """Return every process's row count: `most` rounded up to whole chunks of every piece."""
        unit = self.pieces * self.chunk_rows
        return max(math.ceil(most / unit), 1) * unit


def spread(
    rows: Sequence[FlowGRPORow], pieces: int, padded: int, nodes: Sequence[str] = ()
) -> list[FlowGRPORow | None]:
    """Shuffle `rows` (torch's generator, as TRL's shuffle) and spread them over equal pieces.

    Piece k takes its share of the real rows, then None (padding) up to `padded / pieces`.
    With `nodes` (trained nodes, each its own adapter) a piece's rows are ordered by node, so
    its chunks mostly run under one adapter each.
    """
    order = [rows[i] for i in torch.randperm(len(rows)).tolist()] if rows else []
    size = padded // pieces
    out: list[FlowGRPORow | None] = []
    start = 0
    for piece in range(pieces):
        take = len(order) // pieces + int(piece < len(order) % pieces)
        part = order[start : start + take]
        if nodes:
            part.sort(key=lambda row: nodes.index(row.node))
        out += part + [None] * (size - take)
        start += take
    return out


def step_tensors(
    rows: Sequence[FlowGRPORow],
    mode: str,
    batching: Batching,
    *,
    gather: Gather,
    pad_token_id: int,
    device: Any,
    nodes: Sequence[str] = (),
) -> dict[str, Any]:
    """Return this process's padded tensors of a generation batch, normalised globally.

    Besides TRL's keys: `num_items_in_batch`, the global token count; per row, `flow_items`,
    the `num_items_in_batch` of the chunk it falls in, and `flow_live`, 1 when its update has
    a trainable token on some process (an update without any is skipped by every process).
    With `nodes` (trained nodes with adapters of their own), `flow_node`: each row's node's
    index in `nodes`, -1 for padding.
    """
    local = [weight_count(rows, mode), sum(len(r.completion_ids) for r in rows), len(rows)]
    table = gather(torch.tensor(local, dtype=torch.long, device=device))
    table = table.view(batching.processes, 3)
    total_count, total_tokens = (int(v) for v in table[:, :2].sum(0))
    ordered = spread(rows, batching.pieces, batching.padded(int(table[:, 2].max())), nodes)
    if mode == "verl_like":
        items = verl_items(ordered, batching)
        scales = [1.0] * len(ordered)
    else:
        share = local[0] / max(total_count, 1)  # this process's part of Q (or of the rows)
        for row in rows:
            row.token_weight *= share
        items = [float(total_tokens)] * len(ordered)
        scales = [row.token_weight * total_tokens if row else 0.0 for row in ordered]
    output = rows_to_tensors(ordered, pad_token_id, device, scales)
    output["num_items_in_batch"] = torch.tensor(float(total_tokens), device=device)
    output["flow_items"] = torch.tensor(items, dtype=torch.float32, device=device)
    output["flow_live"] = live_rows(ordered, batching, gather, device)
    if nodes:
        index = [nodes.index(row.node) if row is not None else -1 for row in ordered]
        output["flow_node"] = torch.tensor(index, dtype=torch.long, device=device)
    return output


def verl_items(ordered: Sequence[FlowGRPORow | None], batching: Batching) -> list[float]:
    """Set verl's micro-batch weights; return each row's chunk normaliser for TRL.

    verl's micro-batch loss is `masked_mean(loss, mask) / gradient_accumulation`, with
    `gradient_accumulation` the micro-batches of an update (`ppo_mini_batch_size //
    ppo_micro_batch_size_per_gpu`), and FSDP averages the processes: a token of a chunk with T
    tokens weighs 1 / (processes x chunks per update x T). TRL's D is that with
    `num_items_in_batch = processes x steps_per_generation x chunks per piece x T`.
    """
    chunks = len(ordered) // batching.pieces // batching.chunk_rows  # per piece
    per_update = chunks * batching.accumulation
    items: list[float] = []
    for start in range(0, len(ordered), batching.chunk_rows):
        chunk = ordered[start : start + batching.chunk_rows]
        tokens = sum(len(row.completion_ids) for row in chunk if row is not None)
        for row in chunk:
            if row is not None:
                row.token_weight = 1.0 / (batching.processes * per_update * max(tokens, 1))
        items += [float(batching.processes * batching.pieces * chunks * tokens)] * len(chunk)
    return items


def live_rows(
    ordered: Sequence[FlowGRPORow | None], batching: Batching, gather: Gather, device: Any
) -> torch.Tensor:
    """Return 1 for each row whose optimizer step has a trainable token on some process."""
    size = len(ordered) // batching.pieces
    tokens = [
        sum(len(row.completion_ids) for row in ordered[k * size : (k + 1) * size] if row)
        for k in range(batching.pieces)
    ]
    pieces = gather(torch.tensor(tokens, dtype=torch.long, device=device))
    pieces = pieces.view(batching.processes, batching.pieces).sum(0)
    updates = pieces.view(-1, batching.accumulation).sum(1) > 0
    return updates.repeat_interleave(batching.accumulation * size).to(torch.float32)


def rows_to_tensors(
    rows: Sequence[FlowGRPORow | None],
    pad_token_id: int,
    device: Any,
    advantage_scale: Sequence[float],
) -> dict[str, Any]:
    """Return left-padded prompts, right-padded completions, per-token advantages, old logprobs.

    Every token of row i gets the advantage `A_i * advantage_scale[i]`; the layout
    (`step_tensors`) chooses the scale so that TRL's `dapo` loss is the mode's
    objective. A None row is padding: one pad token of prompt and no completion token, so it
    weighs nothing; the one prompt token keeps its attention row from being all masked, which
    would make its (masked) loss NaN.
    """
    n = max(len(rows), 1)
    real = [row for row in rows if row is not None]
    prompt_len = max([len(row.prompt_ids) for row in real] + [1])
    completion_len = max([len(row.completion_ids) for row in real] + [1])
    prompt_ids = torch.full((n, prompt_len), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, prompt_len), dtype=torch.long)
    prompt_mask[:, -1] = 1
    completion_ids = torch.full((n, completion_len), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((n, completion_len), dtype=torch.long)
    advantages = torch.zeros((n, completion_len), dtype=torch.float32)
    old_logps = torch.zeros((n, completion_len), dtype=torch.float32)
    for i, row in enumerate(rows):
        if row is None:
            continue
        p, c = len(row.prompt_ids), len(row.completion_ids)
        if p:
            prompt_ids[i, prompt_len - p :] = torch.tensor(row.prompt_ids)
            prompt_mask[i, prompt_len - p :] = 1
        if c:
            completion_ids[i, :c] = torch.tensor(row.completion_ids)
            completion_mask[i, :c] = 1
            advantages[i, :c] = row.advantage * advantage_scale[i]
            if row.token_scales is not None:  # a stale row's importance weights
                advantages[i, :c] *= torch.tensor(row.token_scales)
            old_logps[i, :c] = torch.tensor(row.old_logprobs)
    return {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "advantages": advantages.to(device),
        "old_per_token_logps": old_logps.to(device),
    }
