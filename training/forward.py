"""No-grad forwards over a step's padded batch: the KL reference's logprobs, recomputed old ones."""

from __future__ import annotations

from typing import Any

import torch


def forward_logps(trainer: Any, model: Any, tensors: dict[str, Any]) -> Any:
    """Return the completion tokens' logprobs under `model`, as TRL's loss computes them.

    TRL's own forward (`_get_per_token_logps_and_entropies`: its temperature, its autocast),
    without gradients, in chunks of the per-device batch so its peak memory is a micro-batch's.
    """
    ids = torch.cat([tensors["prompt_ids"], tensors["completion_ids"]], dim=1)
    mask = torch.cat([tensors["prompt_mask"], tensors["completion_mask"]], dim=1)
    with torch.no_grad():
        logps, _, _ = trainer._get_per_token_logps_and_entropies(
            model,
            ids,
            mask,
            tensors["completion_ids"].size(1),
            batch_size=trainer.args.per_device_train_batch_size,
        )
    return logps


def reference_logps(trainer: Any, tensors: dict[str, Any]) -> Any:
    """Return the KL reference's logprobs over the batch's completions.

    The reference is the in-memory frozen copy, or under LoRA the model with its adapter off
    (TRL's "ref" adapter instead, where TRL copied a pretrained adapter).
    """
    if trainer.ref_model is not None:
        return forward_logps(trainer, trainer.ref_model, tensors)
    from trl.trainer.utils import use_adapter

    model = trainer.accelerator.unwrap_model(trainer.model)
    with use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None):
        return forward_logps(trainer, trainer.model, tensors)


def recompute_old_logps(trainer: Any, tensors: dict[str, Any]) -> None:
    """Replace the logged old logprobs with the training forward's, and log their gap.

    As verl does: the ratio's denominator then comes from the same kernels, precision and
    batch shapes as its numerator, so at the first update the ratio is 1 exactly; the logged
    ones differ by the numerics of generation (bf16 and KV-cached decoding). The gap is the
    metric `flow/old_logprob_gap`, the mean |logged - recomputed| over completion tokens.
    """
    recomputed = forward_logps(trainer, trainer.model, tensors)
    mask = tensors["completion_mask"].bool()
    if bool(mask.any()):
        gap = (tensors["old_per_token_logps"] - recomputed).abs()[mask].mean()
        trainer._metrics["train"]["flow/old_logprob_gap"].append(float(gap))
    tensors["old_per_token_logps"] = recomputed.to(tensors["old_per_token_logps"].dtype)
