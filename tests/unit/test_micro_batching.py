"""Micro-batching: k micro-steps, and chunks of rows within them, give one batch's gradient.

The toy step has 13 rows (1 to 3 turns per rollout) for 8 rollouts, so a micro-step holds more
rows than per_device_train_batch_size (its rows go through the model in chunks) and the
layout pads with weightless rows. `paper` and `sequence` are checked against the objective
written out on the unpadded rows in one backward; `verl_like` against verl's per micro-batch
token mean over the trainer's own micro-batches, in one backward.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from flow_rows import KeepGradients, perturb, relative_gap, toy_config, toy_trajectories
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl_reference import compute_policy_loss, log_probs, low_var_kl

from flowlearn.graphs import Context
from flowlearn.training import build_flow_grpo_rows
from flowlearn.training.trainer import FlowGRPOTrainer

CONTEXT = Context(max_turns=3, planner_temperature=0.7, planner_max_new_tokens=16)
BETA = 0.04
ONE_BATCH = {"per_device_train_batch_size": 8}  # 8 rollouts, 13 rows: 2 chunks
MICRO = {"per_device_train_batch_size": 2, "steps_per_generation": 4}


def trained(tiny_model_dir: Path, out: Path, mode: str, **options: Any) -> tuple[Any, Any, Any]:
    """Train one step at learning rate 0; return the gradients, the trainer, the trajectories."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trajectories = toy_trajectories(model)
    keep = KeepGradients()
    trainer = FlowGRPOTrainer.offline(
        model,
        args=toy_config(out, learning_rate=0.0, beta=BETA, **options),
        trajectories=trajectories,
        context=CONTEXT,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        mode=mode,
        callbacks=[keep],
    )
    perturb(model, seed=1, scale=0.003)  # off its frozen KL reference
    trainer.train()
    return keep.steps, trainer, trajectories


def one_row(model: Any, prompt: list[int], completion: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


def objective_gradient(trainer: Any, trajectories: Any, mode: Any) -> dict[str, torch.Tensor]:
    """The mode's loss on unpadded rows, one backward: -sum(w x clipped) + beta x token-mean KL."""
    model = trainer.model
    rows = build_flow_grpo_rows(trajectories, mode).rows
    tokens = sum(len(row.completion_ids) for row in rows)
    model.zero_grad()
    loss = torch.zeros(())
    for row in rows:
        new = one_row(model, row.prompt_ids, row.completion_ids)
        ratio = torch.exp(new - torch.tensor(row.old_logprobs))
        a = row.advantage
        loss = loss - row.token_weight * torch.min(ratio * a, ratio.clamp(0.8, 1.3) * a).sum()
        with torch.no_grad():
            ref = one_row(trainer.ref_model, row.prompt_ids, row.completion_ids)
        loss = loss + BETA * (torch.exp(ref - new) - (ref - new) - 1).sum() / tokens
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["paper", "sequence"])
def test_micro_steps_and_chunks_give_one_batchs_gradient(
    tiny_model_dir: Path, tmp_path: Path, mode: str
) -> None:
    one, trainer, trajectories = trained(tiny_model_dir, tmp_path / "one", mode, **ONE_BATCH)
    reference = objective_gradient(trainer, trajectories, mode)
    assert relative_gap(one[0], reference) < 1e-5
    micro, trainer, _ = trained(
        tiny_model_dir, tmp_path / "micro", mode, gradient_accumulation_steps=4, **MICRO
    )
    assert trainer._buffered_inputs[0]["completion_ids"].size(0) == 4  # 16 rows: 3 padding
    assert len(micro) == 1 and relative_gap(micro[0], reference) < 1e-5
    # two updates per step: each is twice its half's part, together the one batch's
    halves, _, _ = trained(
        tiny_model_dir,
        tmp_path / "halves",
        mode,
        gradient_accumulation_steps=2,
        max_steps=2,
        **MICRO,
    )
    assert len(halves) == 2
    mean = {k: (halves[0][k] + halves[1][k]) / 2 for k in reference}
    assert relative_gap(mean, reference) < 1e-5


def verl_one_backward(trainer: Any) -> dict[str, torch.Tensor]:
    """verl's update loss over the trainer's micro-batches (2 rows each) in one backward."""
    model = trainer.model
    model.zero_grad()
    micro_batches = []
    for piece in trainer._buffered_inputs:
        for start in range(0, piece["completion_ids"].size(0), 2):
            rows = slice(start, start + 2)
            micro_batches.append({k: v[rows] for k, v in piece.items() if v.ndim == 2})
    loss = torch.zeros(())
    for micro in micro_batches:
        mask = micro["completion_mask"].float()
        logps = log_probs(model, micro, 0.7)
        pg = compute_policy_loss(
            micro["old_per_token_logps"], logps, micro["advantages"], mask, 0.2, 0.3
        )
        kl = (low_var_kl(logps, micro["ref_per_token_logps"]) * mask).sum()
        loss = loss + (pg + BETA * kl / (mask.sum() + 1e-8)) / len(micro_batches)
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
def test_verl_like_micro_steps_give_verls_loss_in_one_backward(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    grads, trainer, _ = trained(
        tiny_model_dir,
        tmp_path / "verl_like",
        "verl_like",
        gradient_accumulation_steps=4,
        delta=3.0,
        **MICRO,
    )
    assert len(grads) == 1 and math.isfinite(sum(float(g.sum()) for g in grads[0].values()))
    assert relative_gap(grads[0], verl_one_backward(trainer)) < 1e-5


def test_the_config_derives_and_checks_the_micro_steps() -> None:
    from flowlearn.training.config import FlowGRPOConfig

    base = {"benchmark": "gameof24", "questions_per_step": 4, "num_generations": 8}
    plain = FlowGRPOConfig(**base)
    assert (plain.per_device_train_batch_size, plain.steps_per_generation) == (32, 1)
    paper = FlowGRPOConfig(**base, per_device_train_batch_size=4, gradient_accumulation_steps=8)
    assert (paper.steps_per_generation, paper.gradient_accumulation_steps) == (8, 8)
    verl_like = FlowGRPOConfig(
        **base,
        mode="verl_like",
        per_device_train_batch_size=4,
        steps_per_generation=8,
        gradient_accumulation_steps=2,  # 4 updates per step, as the official config's
    )
    assert verl_like.delta == 3.0  # verl's dual clip
    with pytest.raises(ValueError, match="set gradient_accumulation_steps=8 for one update"):
        FlowGRPOConfig(**base, per_device_train_batch_size=4)
    with pytest.raises(ValueError, match="must not span two generation batches"):
        FlowGRPOConfig(**base, steps_per_generation=2, gradient_accumulation_steps=4)
