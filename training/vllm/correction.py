"""Importance correction of rows whose logprobs are not the trainer's forward's, as TRL does it.

Why it looks like this:
1. With the planner on a server, a row's `policy_version` names the adapter that sampled it;
   a row of an older adapter than the trainer's weights ("stale") came from another policy.
2. It is corrected as TRL's vLLM path corrects its samples: the PPO ratio's denominator
   becomes the trainer's own logprobs under the current weights (a no-grad forward), and the
   gap to the sampler is weighed by the importance ratio rho = exp(logp_trainer - logp_sampled),
   per token or per sequence, truncated (clipped) or masked (zeroed) outside
   [clip_min, clip_max]: TRL's `vllm_importance_sampling_correction`, `_mode`, `_clip_min` and
   `_clip_max`, with TRL's meanings and defaults.
3. TRL multiplies each token's policy loss by rho. Since rho >= 0 and that loss is
   -min(r A, clip(r) A), it equals the loss with the advantage A * rho, so rho rides on the
   row's per-token advantages (`FlowGRPORow.token_scales`) and the KL term is left alone, as
   in TRL.
4. The forward runs on the unwrapped model: no collective, so a process with stale rows never
   waits for one without.
5. Stale rows are counted in `flow/stale_rows` (every step), their mean weight in
   `flow/stale_is_ratio`; with the correction off they are counted and trained as sampled.
   With several trained nodes each node has its own current adapter: a row is stale when its
   version is not its node's, and is scored under its node's adapter.
6. On TRL's vLLM generation (`use_vllm`) every row needs it: vLLM samples with its own kernels,
   so its logprobs differ from the training forward's. TRL's vLLM path takes the old logprobs
   from the training forward and weighs each row's loss by the same ratio
   (`vllm_importance_sampling_mode`); its loss multiplies by `importance_sampling_ratio`.
   `importance_ratio` is that ratio over the flow's padded rows, with TRL's metric names.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from flowlearn.engine.adapters import active_adapter
from flowlearn.training.batches import rows_to_tensors
from flowlearn.training.model import forward_logps
from flowlearn.training.rows import FlowGRPORow
from flowlearn.training.vllm.settings import IS_MODES


def importance_weights(
    trainer_logps: torch.Tensor,
    sampled_logps: torch.Tensor,
    mode: str = "sequence_mask",
    clip_min: float | None = None,
    clip_max: float | None = 3.0,
) -> torch.Tensor:
    """Return the importance weight of each token of one completion, as TRL computes it.

    Args:
        trainer_logps: the tokens' logprobs under the weights being trained.
        sampled_logps: their logprobs under the policy that sampled them.
        mode: `token_*` weighs each token by its own ratio, `sequence_*` every token by the
            completion's (the exp of the summed log-ratios); `*_truncate` clips the ratio to
            [clip_min, clip_max], `*_mask` sets a ratio outside it to 0.
        clip_min: the lower bound (None: none).
        clip_max: the upper bound (None: none).

    Raises:
        ValueError: an unknown mode.

    >>> importance_weights(torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0]),
    ...                    "token_truncate", clip_max=1.5).tolist()
    [1.5, 0.3678794503211975]

    """
    if mode not in IS_MODES:
        raise ValueError(f"vllm_importance_sampling_mode must be one of {IS_MODES}, got {mode!r}")
    diff = torch.nan_to_num(trainer_logps.float() - sampled_logps.float(), nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum().expand_as(diff)
    ratio = torch.exp(diff)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    if mode.endswith("truncate"):
        return ratio.clamp(min=low, max=high)
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


Current = str | Mapping[str, str]
"""The version of the weights being trained: one, or each trained node's (by `row.node`)."""


def stale_rows(rows: Sequence[FlowGRPORow], current: Current) -> list[FlowGRPORow]:
    """Return the rows some other version than `current` sampled (unversioned rows are not).

    With a version per node, a row is stale when its version is not its node's.
    """
    return [r for r in rows if r.policy_version is not None and r.policy_version != now(r, current)]


def now(row: FlowGRPORow, current: Current) -> str | None:
    """Return the version of the weights training `row` now (None: its node is not trained)."""
    return current if isinstance(current, str) else current.get(row.node)


def correct_stale_rows(
    trainer: Any,
    rows: Sequence[FlowGRPORow],
    current: Current,
    settings: tuple[str, float | None, float | None] | None = None,
) -> int:
    """Reweigh the stale rows in place (old logprobs, token scales); return and log their count.

    Args:
        trainer: a `FlowGRPOTrainer`: its unwrapped model scores the rows, its args hold
            TRL's `vllm_importance_sampling_*` settings, its metrics get the counts.
        rows: this process's rows of the step.
        current: the version of the weights being trained; with several trained nodes, each
            node's (its adapter's name), and each node's rows are scored under its adapter.
        settings: `(mode, clip_min, clip_max)` of `importance_weights`; None: TRL's
            `vllm_importance_sampling_*` of `trainer.args` (asynchronous rollouts pass their
            own truncation cap, `producer.AsyncRollouts.correct`).

    """
    stale = stale_rows(rows, current)
    metrics = trainer._metrics["train"]
    metrics["flow/stale_rows"].append(float(len(stale)))
    args = trainer.args
    trl_switch = getattr(args, "vllm_importance_sampling_correction", True)
    if not stale or (settings is None and not trl_switch):  # asynchronous rollouts: always
        return len(stale)
    model = trainer.accelerator.unwrap_model(trainer.model)
    weights: list[float] = []
    nodes: list[str | None] = [None] if isinstance(current, str) else [r.node for r in stale]
    for node in dict.fromkeys(nodes):  # one adapter: every stale row at once; else by node
        group = [r for r in stale if node is None or r.node == node]
        with contextlib.nullcontext() if node is None else active_adapter(model, node):
            weights += reweigh(trainer, model, group, settings)
    if weights:
        metrics["flow/stale_is_ratio"].append(sum(weights) / len(weights))
    return len(stale)


def reweigh(
    trainer: Any,
    model: Any,
    stale: Sequence[FlowGRPORow],
    settings: tuple[str, float | None, float | None] | None = None,
) -> list[float]:
    """Score `stale` under `model` as it is now; set their old logprobs and token scales.

    Returns every completion token's importance weight.
    """
    args = trainer.args
    tensors = rows_to_tensors(
        stale, trainer.processing_class.pad_token_id, trainer.accelerator.device, [1.0] * len(stale)
    )
    logps = forward_logps(trainer, model, tensors).float().cpu()
    mode, low, high = settings or (
        getattr(args, "vllm_importance_sampling_mode", "sequence_mask"),
        getattr(args, "vllm_importance_sampling_clip_min", None),
        getattr(args, "vllm_importance_sampling_clip_max", 3.0),
    )
    weights: list[float] = []
    for i, row in enumerate(stale):
        ours = logps[i, : len(row.completion_ids)]
        scale = importance_weights(ours, torch.tensor(row.old_logprobs), mode, low, high)
        row.old_logprobs = ours.tolist()  # a new list: the transition's stays as sampled
        row.token_scales = scale.tolist()
        weights += row.token_scales
    return weights


def importance_ratio(trainer: Any, sampled: Any, recomputed: Any, mask: Any) -> Any:
    """Return TRL's importance-sampling ratio of the training forward to vLLM's logprobs.

    Each row's ratio is `importance_weights` (TRL's arithmetic, the one the stale rows of the
    server path get), laid out per token; padding is 0.

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
