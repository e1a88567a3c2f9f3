"""`verl_like` mode against verl v0.5.0's arithmetic, written out in tests/verl_reference.py.

A toy batch with varied turns, a question with a single turn-sample (verl's singleton rule)
and negative-advantage tokens whose ratio passes clip_ratio_c (the dual clip), trained as the
official config does: several mini-batch updates per rollout batch, micro-batches of two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from flow_rows import KeepGradients, Spec, perturb, relative_gap, toy_config, toy_trajectories
from transformers import AutoModelForCausalLM, AutoTokenizer
from verl_reference import compute_grpo_outcome_advantage, mini_batch_gradient

from flowlearn.graphs import Context
from flowlearn.training.trainer import FlowGRPOTrainer

CONTEXT = Context(max_turns=3, planner_temperature=0.7, planner_max_new_tokens=16)
OFFICIAL_SPEC: Spec = {  # 16 rows: 4 micro-steps x 2 micro-batches of 2 rows, no padding
    "a": [(1.0, [3, 4, 2]), (0.0, [5])],
    "b": [(0.0, [2, 3, 6]), (1.0, [4, 2, 3])],
    "c": [(1.0, [5]), (0.0, [])],  # one turn-sample in all: mean 0, std 1
    "d": [(0.0, [3, 2]), (1.0, [4, 5, 2])],
}
MICRO_ROWS = 2  # verl's ppo_micro_batch_size_per_gpu here
LOSS = {"temperature": 0.7, "clip": (0.2, 0.3), "kl_loss_coef": 0.04}


def verl_micro_batches(trainer: Any, samples: dict[Any, tuple[float, str]]) -> list[Any]:
    """Return the trainer's micro-batches in its order, with verl's advantages filled in."""
    micro_batches = []
    for piece in trainer._buffered_inputs:
        for start in range(0, piece["completion_ids"].size(0), MICRO_ROWS):
            rows = slice(start, start + MICRO_ROWS)
            micro = {
                key: piece[key][rows]
                for key in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
            }
            micro["old_log_probs"] = piece["old_per_token_logps"][rows]
            micro["ref_log_prob"] = piece["ref_per_token_logps"][rows]
            micro["trainer_advantages"] = piece["advantages"][rows, 0]
            micro["keys"] = [
                (tuple(p[m.bool()].tolist()), tuple(c[n.bool()].tolist()))
                for p, m, c, n in zip(
                    micro["prompt_ids"],
                    micro["prompt_mask"],
                    micro["completion_ids"],
                    micro["completion_mask"],
                    strict=True,
                )
            ]
            micro_batches.append(micro)
    keys = [key for micro in micro_batches for key in micro["keys"]]
    assert sorted(keys) == sorted(samples)  # every row once, no padding
    advantages = compute_grpo_outcome_advantage(
        [samples[k][0] for k in keys], [samples[k][1] for k in keys]
    )
    for micro in micro_batches:
        values = torch.tensor([advantages[keys.index(k)] for k in micro["keys"]])
        micro["advantages"] = values[:, None] * micro["completion_mask"]
    return micro_batches


@pytest.mark.slow
def test_verl_like_mode_makes_verls_updates(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trajectories = toy_trajectories(model, OFFICIAL_SPEC, seed=2)
    for trajectory in trajectories:  # the dual clip's case: A < 0 and a ratio above 3
        if trajectory.reward == 0.0:
            for transition in trajectory.transitions:
                transition["logprobs"][0] -= 1.5  # type: ignore[index]
    keep = KeepGradients()
    trainer = FlowGRPOTrainer.offline(
        model,
        args=toy_config(
            tmp_path,
            per_device_train_batch_size=MICRO_ROWS,
            steps_per_generation=4,
            gradient_accumulation_steps=2,  # 2 mini-batch updates per rollout batch
            learning_rate=0.0,  # every update's gradient at the same weights
            max_steps=2,  # optimizer steps: one rollout batch
            beta=LOSS["kl_loss_coef"],
            delta=3.0,  # verl's clip_ratio_c, as FlowGRPOConfig sets for mode verl_like
        ),
        trajectories=trajectories,
        context=CONTEXT,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        mode="verl_like",
        callbacks=[keep],
    )
    perturb(model, seed=1, scale=0.003)  # off its frozen KL reference
    trainer.train()
    assert trainer.state.global_step == 2 and len(keep.steps) == 2

    samples = {
        (tuple(t["prompt_ids"] or []), tuple(t["completion_ids"] or [])): (
            trajectory.total_reward,
            trajectory.group_id,
        )
        for trajectory in trajectories
        for t in trajectory.transitions
    }
    micro_batches = verl_micro_batches(trainer, samples)
    for micro in micro_batches:  # the trainer's advantages are verl's (unbiased std, singleton)
        verl = micro["advantages"][:, 0]
        assert torch.allclose(micro["trainer_advantages"], verl, atol=1e-6, rtol=0)
    singleton = [k for k, (_, group) in samples.items() if group == "c"]
    assert len(singleton) == 1
    for update, grads in enumerate(keep.steps):  # 4 micro-batches per update
        mine = micro_batches[4 * update : 4 * update + 4]
        reference = mini_batch_gradient(model, mine, 4, **LOSS)
        assert relative_gap(grads, reference) < 1e-5, update
    # the check has teeth: without the dual clip the first update's gradient differs
    plain = mini_batch_gradient(model, micro_batches[:4], 4, clip_ratio_c=1e9, **LOSS)
    assert relative_gap(keep.steps[0], plain) > 1e-3


def test_verl_like_mode_without_the_dual_clip_is_refused(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    trainer = FlowGRPOTrainer.offline(
        model,
        args=toy_config(tmp_path, per_device_train_batch_size=MICRO_ROWS, steps_per_generation=4),
        trajectories=toy_trajectories(model, OFFICIAL_SPEC),
        context=CONTEXT,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        mode="verl_like",
    )
    with pytest.raises(ValueError, match=r"set delta=3\.0"):
        trainer.train()
