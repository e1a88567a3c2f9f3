"""Pad Flow-GRPO rows into the tensors TRL's GRPO loss consumes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flowlearn.training.flow_grpo import FlowGRPORow


def rows_to_tensors(rows: Sequence[FlowGRPORow], pad_token_id: int, device: Any) -> dict[str, Any]:
    """Return left-padded prompts, right-padded completions and per-token advantages.

    TRL's `dapo` loss is `sum(per_token_loss * mask) / num_items_in_batch`. Setting
    `num_items_in_batch` to the batch's token count and each token's advantage to
    `A_i * token_weight * tokens` makes that sum exactly `-sum(token_weight * clipped
    objective)`, the chosen Flow-GRPO mode's objective (the weights are positive, so they pass
    through the min and the clip); the KL term becomes a token mean.
    """
    import torch

    if not rows:
        return empty_batch(pad_token_id, device)
    tokens = sum(len(row.completion_ids) for row in rows)
    prompt_len = max(len(row.prompt_ids) for row in rows)
    completion_len = max(max(len(row.completion_ids) for row in rows), 1)
    n = len(rows)
    prompt_ids = torch.full((n, prompt_len), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, prompt_len), dtype=torch.long)
    completion_ids = torch.full((n, completion_len), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((n, completion_len), dtype=torch.long)
    advantages = torch.zeros((n, completion_len), dtype=torch.float32)
    old_logps = torch.zeros((n, completion_len), dtype=torch.float32)
    for i, row in enumerate(rows):
        p, c = len(row.prompt_ids), len(row.completion_ids)
        prompt_ids[i, prompt_len - p :] = torch.tensor(row.prompt_ids)
        prompt_mask[i, prompt_len - p :] = 1
        if c:
            completion_ids[i, :c] = torch.tensor(row.completion_ids)
            completion_mask[i, :c] = 1
            advantages[i, :c] = row.advantage * row.token_weight * tokens
            old_logps[i, :c] = torch.tensor(row.old_logprobs)
    return {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "advantages": advantages.to(device),
        "old_per_token_logps": old_logps.to(device),
        "num_items_in_batch": torch.tensor(float(tokens), device=device),
    }


def empty_batch(pad_token_id: int, device: Any) -> dict[str, Any]:
    """Return a one-row batch with no trainable token: the trainer skips its update.

    It is what a step gets when every rollout was dropped (failed rewards under `drop`, or
    only zero-variance groups with `drop_zero_variance`): the run goes on to the next step.
    """
    import torch

    zeros = torch.zeros((1, 1), dtype=torch.float32, device=device)
    return {
        "prompt_ids": torch.full((1, 1), pad_token_id, dtype=torch.long, device=device),
        "prompt_mask": torch.ones((1, 1), dtype=torch.long, device=device),
        "completion_ids": torch.full((1, 1), pad_token_id, dtype=torch.long, device=device),
        "completion_mask": torch.zeros((1, 1), dtype=torch.long, device=device),
        "advantages": zeros,
        "old_per_token_logps": zeros.clone(),
        "num_items_in_batch": torch.tensor(0.0, device=device),
    }
