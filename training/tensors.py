"""Pad Flow-GRPO rows into the tensors TRL's GRPO loss consumes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowlearn.training.flow_grpo import FlowGRPORow


def rows_to_tensors(
    rows: Sequence[FlowGRPORow | None],
    pad_token_id: int,
    device: Any,
    advantage_scale: Sequence[float],
) -> dict[str, Any]:
    """Return left-padded prompts, right-padded completions, per-token advantages, old logprobs.

    Every token of row i gets the advantage `A_i * advantage_scale[i]`; the layout
    (`flowlearn.training.layout`) chooses the scale so that TRL's `dapo` loss is the mode's
    objective. A None row is padding: one pad token of prompt and no completion token, so it
    weighs nothing; the one prompt token keeps its attention row from being all masked, which
    would make its (masked) loss NaN.
    """
    import torch

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
