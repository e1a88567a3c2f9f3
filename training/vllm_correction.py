"""TRL's vLLM importance-sampling correction, over a Flow-GRPO step's padded tensors.

vLLM samples with its own kernels, so its logprobs differ from the training forward's. TRL's vLLM
path takes the old logprobs from the training forward and weighs each row's loss by the ratio
`exp(training forward - vLLM)`, per token or per sequence, truncated or masked outside
`[vllm_importance_sampling_clip_min, vllm_importance_sampling_clip_max]`
(`vllm_importance_sampling_mode`); its loss multiplies by `importance_sampling_ratio`. This is
that ratio, computed over the flow's rows, with TRL's metric names.
"""

from __future__ import annotations

from typing import Any

import torch

from flowlearn.training.stale_rows import importance_weights


def importance_ratio(trainer: Any, sampled: Any, recomputed: Any, mask: Any) -> Any:
    """Return TRL's importance-sampling ratio of the training forward to vLLM's logprobs.

    Each row's ratio is `stale_rows.importance_weights` (TRL's arithmetic, the one the stale
    rows of the server path get), laid out per token; padding is 0.

    Args:
        trainer: the trainer, with TRL's `vllm_importance_sampling_*` attributes.
        sampled: (rows, tokens) logprobs logged by vLLM when sampling.
        recomputed: (rows, tokens) logprobs of the training forward, the old policy's.
        mask: (rows, tokens) completion mask; padding rows are all zero.

    Returns:
        (rows, tokens), the factor of each token's policy loss.

    """
    mode = trainer.vllm_importance_sampling_mode
    ratio = torch.zeros_like(recomputed, dtype=torch.float32)
    for row, length in enumerate(mask.sum(-1).tolist()):
        if length:
            ratio[row, : int(length)] = importance_weights(
                recomputed[row, : int(length)],
                sampled[row, : int(length)],
                mode,
                trainer.vllm_importance_sampling_clip_min,
                trainer.vllm_importance_sampling_clip_max,
            )
    log_ratio(trainer, ratio, mask, masking=mode.endswith("_mask"))
    return ratio


def log_ratio(trainer: Any, ratio: Any, mask: Any, *, masking: bool) -> None:
    """Log the ratio's mean over all processes' completion tokens, and the masked share.

    Collective (`gather`): every process calls it once per generation batch.
    """
    values = ratio[mask.bool()]
    local = [float(values.sum()), float(values.numel()), float((values == 0).sum())]
    table = torch.tensor(local, device=trainer.accelerator.device)
    total, count, zeros = trainer.accelerator.gather(table).view(-1, 3).sum(0).tolist()
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    metrics["sampling/importance_sampling_ratio/mean"].append(total / count if count else 1.0)
    if masking:
        metrics["flow/importance_sampling_masked"].append(zeros / count if count else 0.0)
