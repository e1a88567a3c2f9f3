"""verl v0.5.0's GRPO arithmetic, written out from its code, to check `verl_like` mode against.

The official AgentFlow code trains with verl v0.5.0 (github.com/volcengine/verl, tag v0.5.0):
- `verl/trainer/ppo/core_algos.py`: `compute_grpo_outcome_advantage`, `compute_policy_loss`
  (dual clip, `clip_ratio_c`), `agg_loss` ("token-mean"), `kl_penalty` ("low_var_kl");
- `verl/utils/torch_functional.py`: `masked_mean`;
- `verl/workers/actor/dp_actor.py`: `DataParallelPPOActor.update_policy`, which zeroes the
  gradient, backpropagates `loss / gradient_accumulation` per micro-batch
  (`gradient_accumulation = ppo_mini_batch_size // ppo_micro_batch_size_per_gpu`) and steps the
  optimizer once per mini-batch.
Each function below follows the named one line by line (names kept), for one process.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch


def compute_grpo_outcome_advantage(
    scores: Sequence[float], index: Sequence[str], epsilon: float = 1e-6
) -> list[float]:
    """core_algos.compute_grpo_outcome_advantage, norm_adv_by_std_in_grpo=True."""
    id2score: dict[str, list[float]] = defaultdict(list)
    id2mean, id2std = {}, {}
    for score, idx in zip(scores, index, strict=True):
        id2score[idx].append(score)
    for idx, values in id2score.items():
        if len(values) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            id2mean[idx] = torch.mean(torch.tensor(values))
            id2std[idx] = torch.std(torch.tensor([values]))
    return [
        float((s - id2mean[i]) / (id2std[i] + epsilon)) for s, i in zip(scores, index, strict=True)
    ]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """torch_functional.masked_mean over all elements (agg_loss "token-mean")."""
    return (values * mask).sum() / (mask.sum() + 1e-8)


def compute_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_low: float,
    cliprange_high: float,
    clip_ratio_c: float = 3.0,
) -> torch.Tensor:
    """core_algos.compute_policy_loss (the dual-clip PPO loss), loss_agg_mode "token-mean"."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return masked_mean(pg_losses, response_mask)


def low_var_kl(logprob: torch.Tensor, ref_logprob: torch.Tensor) -> torch.Tensor:
    """core_algos.kl_penalty, kl_penalty="low_var_kl" (verl's default kl_loss_type)."""
    kl = torch.clamp(ref_logprob - logprob, min=-20, max=20)
    ratio = torch.exp(kl)
    return torch.clamp(ratio - kl - 1, min=-10, max=10)


def log_probs(model: Any, micro: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """The actor's response logprobs at the rollout temperature (dp_actor._forward_micro_batch)."""
    ids = torch.cat([micro["prompt_ids"], micro["completion_ids"]], 1)
    mask = torch.cat([micro["prompt_mask"], micro["completion_mask"]], 1)
    width = micro["completion_ids"].size(1)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, -width - 1 : -1]
    logps = torch.log_softmax(logits.float() / temperature, -1)
    return logps.gather(-1, micro["completion_ids"][..., None])[..., 0]


def micro_batch_loss(
    model: Any,
    micro: dict[str, torch.Tensor],
    *,
    temperature: float,
    clip: tuple[float, float],
    kl_loss_coef: float,
    clip_ratio_c: float = 3.0,
) -> torch.Tensor:
    """update_policy's `policy_loss` of one micro-batch (before `/ gradient_accumulation`)."""
    log_prob = log_probs(model, micro, temperature)
    mask = micro["completion_mask"].float()
    loss = compute_policy_loss(
        micro["old_log_probs"], log_prob, micro["advantages"], mask, *clip, clip_ratio_c
    )
    if kl_loss_coef:
        kld = low_var_kl(log_prob, micro["ref_log_prob"])
        loss = loss + masked_mean(kld, mask) * kl_loss_coef
    return loss


def mini_batch_gradient(
    model: Any,
    micro_batches: Sequence[dict[str, torch.Tensor]],
    gradient_accumulation: int,
    **loss_options: Any,
) -> dict[str, torch.Tensor]:
    """Return the gradient update_policy applies for one mini-batch."""
    model.zero_grad()
    for micro in micro_batches:
        loss = micro_batch_loss(model, micro, **loss_options) / gradient_accumulation
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return grads
