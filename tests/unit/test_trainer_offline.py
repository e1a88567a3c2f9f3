"""Offline Flow-GRPO training: TRL's loss is the paper's objective; a step moves probability."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from trainer_setup import CONTEXT, config, load

from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Sampling
from flowlearn.training import build_flow_grpo_rows
from flowlearn.training.trainer import FlowGRPOTrainer
from flowlearn.training.trajectories import Trajectory, Transition


def perturbed_trajectories(policy: HFPolicy, seed: int) -> list[Trajectory]:
    """Real rollouts' tokens with logged logprobs shifted, so importance ratios differ from 1."""
    rng = random.Random(seed)
    out = []
    for g in range(2):
        for i in range(2):
            transitions = []
            for t in range(rng.randint(1, 2)):
                gen = policy.generate(
                    [{"role": "user", "content": f"q{g} {i} {t}"}],
                    Sampling(temperature=0.7, max_new_tokens=6, seed=seed + t),
                )
                transitions.append(
                    Transition(
                        trajectory_id=f"{g}/{i}",
                        group_id=str(g),
                        node="planner",
                        turn=t + 1,
                        messages=[],
                        output=gen.text,
                        parse_status="ok",
                        seconds=0.0,
                        prompt_ids=gen.prompt_ids,
                        completion_ids=gen.completion_ids,
                        logprobs=[lp + rng.gauss(0, 0.2) for lp in gen.logprobs or []],
                    )
                )
            out.append(
                Trajectory(
                    trajectory_id=f"{g}/{i}",
                    group_id=str(g),
                    question="q",
                    reference="r",
                    answer="a",
                    final_text="a",
                    reward=float(i == g),
                    transitions=transitions,
                )
            )
    return out


def test_trl_loss_equals_the_papers_objective(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load(tiny_model_dir)
    trajectories = perturbed_trajectories(HFPolicy(model, tokenizer), seed=3)
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, epsilon=0.2, epsilon_high=0.3),
        trajectories=trajectories,
        context=CONTEXT,
        processing_class=tokenizer,
    )
    inputs = trainer._generate_and_score_completions(
        [
            {"prompt": "0", "case": '{"id": "0", "query": "0", "reference": null}'},
            {"prompt": "1", "case": '{"id": "1", "query": "1", "reference": null}'},
        ]
    )
    loss = trainer._compute_loss(model, inputs).item()

    rows = build_flow_grpo_rows(trajectories, "paper").rows
    objective = 0.0
    for row in rows:
        ids = torch.tensor([row.prompt_ids + row.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(row.prompt_ids) - 1 : -1] / 0.7
        logps = torch.log_softmax(logits.float(), -1).gather(
            1, torch.tensor(row.completion_ids)[:, None]
        )[:, 0]
        for new, old in zip(logps.tolist(), row.old_logprobs, strict=True):
            r = math.exp(new - old)
            objective += row.token_weight * min(
                r * row.advantage, min(max(r, 0.8), 1.3) * row.advantage
            )
    assert loss == pytest.approx(-objective, abs=1e-5)


def test_offline_training_from_exported_trajectories(tiny_model_dir: Path, tmp_path: Path) -> None:
    from flowlearn.training import export_parquet, read_parquet

    model, tokenizer = load(tiny_model_dir)
    path = export_parquet(
        perturbed_trajectories(HFPolicy(model, tokenizer), seed=5), tmp_path / "t.parquet"
    )
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, max_steps=1),
        trajectories=read_parquet(path),
        context=CONTEXT,
        processing_class=tokenizer,
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()
    assert sum((before[k] - v).abs().sum().item() for k, v in model.state_dict().items()) > 0


def sequence_logp(model: Any, prompt: list[int], completion: list[int]) -> float:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).sum())


def sampled_group(policy: HFPolicy, rewards: list[float]) -> list[Trajectory]:
    out = []
    for i, reward in enumerate(rewards):
        gen = policy.generate(
            [{"role": "user", "content": "pick a tool"}],
            Sampling(temperature=0.7, max_new_tokens=6, seed=i),
        )
        transition = Transition(
            trajectory_id=f"g/{i}",
            group_id="g",
            node="planner",
            turn=1,
            messages=[],
            output=gen.text,
            parse_status="ok",
            seconds=0.0,
            prompt_ids=gen.prompt_ids,
            completion_ids=gen.completion_ids,
            logprobs=gen.logprobs,
        )
        out.append(
            Trajectory(
                trajectory_id=f"g/{i}",
                group_id="g",
                question="q",
                reference="r",
                answer="a",
                final_text="a",
                reward=reward,
                transitions=[transition],
            )
        )
    return out


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
def test_one_step_moves_probability_towards_rewarded_turns(
    tiny_model_dir: Path, tmp_path: Path, rewards: list[float]
) -> None:
    model, tokenizer = load(tiny_model_dir)
    group = sampled_group(HFPolicy(model, tokenizer), rewards)
    before = [
        sequence_logp(model, t.transitions[0]["prompt_ids"], t.transitions[0]["completion_ids"])
        for t in group
    ]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, max_steps=1, learning_rate=1e-2, weight_decay=0.0, num_generations=4),
        trajectories=group,
        context=CONTEXT,
        processing_class=tokenizer,
    )
    trainer.train()
    after = [
        sequence_logp(model, t.transitions[0]["prompt_ids"], t.transitions[0]["completion_ids"])
        for t in group
    ]
    moved = sum((weights[k] - v).abs().sum().item() for k, v in model.state_dict().items())
    if len(set(rewards)) == 1:  # zero advantages: no gradient, no change
        assert moved == 0.0
        return
    delta = [a - b for a, b in zip(after, before, strict=True)]
    assert min(delta[:2]) > 0 > max(delta[2:]), delta
