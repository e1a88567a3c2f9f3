"""Lay a step's Flow-GRPO rows out for TRL: weights from global counts, pieces, chunks, padding.

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
3. A piece goes through the model in chunks of per_device_train_batch_size rows
   (`flowlearn.training.micro`): a pass's memory does not grow with the turns of a step.
4. `verl_like` follows verl v0.5.0 (which the official code pins), `dp_actor.update_policy`:
   a chunk is one of its micro-batches, whose loss is the token mean over the chunk's own
   tokens divided by the micro-batches of an update; that is one normaliser per chunk.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from flowlearn.training.flow_grpo import FlowGRPORow
from flowlearn.training.tensors import rows_to_tensors
from flowlearn.training.weights import weight_count

Gather = Callable[[torch.Tensor], torch.Tensor]
"""All processes' copies of a 1-d tensor, concatenated (`Accelerator.gather`)."""


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


def spread(rows: Sequence[FlowGRPORow], pieces: int, padded: int) -> list[FlowGRPORow | None]:
    """Shuffle `rows` (torch's generator, as TRL's shuffle) and spread them over equal pieces.

    Piece k takes its share of the real rows, then None (padding) up to `padded / pieces`.
    """
    order = [rows[i] for i in torch.randperm(len(rows)).tolist()] if rows else []
    size = padded // pieces
    out: list[FlowGRPORow | None] = []
    start = 0
    for piece in range(pieces):
        take = len(order) // pieces + int(piece < len(order) % pieces)
        out += order[start : start + take] + [None] * (size - take)
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
) -> dict[str, Any]:
    """Return this process's padded tensors of a generation batch, normalised globally.

    Besides TRL's keys: `num_items_in_batch`, the global token count; per row, `flow_items`,
    the `num_items_in_batch` of the chunk it falls in, and `flow_live`, 1 when its update has
    a trainable token on some process (an update without any is skipped by every process).
    """
    local = [weight_count(rows, mode), sum(len(r.completion_ids) for r in rows), len(rows)]
    table = gather(torch.tensor(local, dtype=torch.long, device=device))
    table = table.view(batching.processes, 3)
    total_count, total_tokens = (int(v) for v in table[:, :2].sum(0))
    ordered = spread(rows, batching.pieces, batching.padded(int(table[:, 2].max())))
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
