"""Toy Flow-GRPO batches on the tiny model, and a callback that keeps each update's gradient.

Shared by the micro-batching, multi-process and verl_like-mode tests: the rows have varied turn
counts and completion lengths, and their logged logprobs are the model's own (at the
trainer's temperature) shifted by noise, so importance ratios spread around 1 and some clip.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback
from trl import GRPOConfig

from flowlearn.training.trajectories import Trajectory, Transition

TEMPERATURE = 0.7
Spec = dict[str, list[tuple[float, list[int]]]]
"""Per question: one (reward, completion length of each planner turn) per rollout."""

SPEC: Spec = {  # 4 questions x G=2, 1 to 3 turns, 13 rows
    "q0": [(1.0, [5, 3]), (0.0, [4])],
    "q1": [(0.0, [2, 6, 3]), (1.0, [7])],
    "q2": [(1.0, [3]), (1.0, [4, 2])],  # equal rewards: no signal
    "q3": [(0.0, [6]), (1.0, [2, 5])],
}


def logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    """Return the model's logprobs of `completion` after `prompt`, at TEMPERATURE."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    logps = torch.log_softmax(logits.float() / TEMPERATURE, -1)
    return logps.gather(1, torch.tensor(completion)[:, None])[:, 0].tolist()


def toy_trajectories(model: Any, spec: Spec = SPEC, seed: int = 0) -> list[Trajectory]:
    """Build rewarded trajectories per `spec`, random token ids, logged logprobs perturbed."""
    rng = random.Random(seed)
    vocab = model.config.vocab_size
    out = []
    for group, rollouts in spec.items():
        for i, (reward, lengths) in enumerate(rollouts):
            tid = f"{group}/{i}"
            transitions = []
            for turn, length in enumerate(lengths, 1):
                prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 8))]
                completion = [rng.randrange(3, vocab) for _ in range(length)]
                logged = [lp + rng.gauss(0, 0.15) for lp in logprobs(model, prompt, completion)]
                transitions.append(
                    Transition(
                        trajectory_id=tid,
                        group_id=group,
                        node="planner",
                        turn=turn,
                        messages=[],
                        output="",
                        parse_status="ok",
                        seconds=0.0,
                        prompt_ids=prompt,
                        completion_ids=completion,
                        logprobs=logged,
                    )
                )
            out.append(Trajectory(tid, group, "q", "r", "a", "a", reward, transitions=transitions))
    return out


def toy_config(out: Path, **overrides: Any) -> GRPOConfig:
    """A one-update CPU config with plain SGD and no clipping, so updates are -lr x gradient."""
    values: dict[str, Any] = dict(
        output_dir=str(out),
        per_device_train_batch_size=8,
        num_generations=2,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_steps=1,
        learning_rate=1.0,
        optim="sgd",
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=0.0,
        temperature=TEMPERATURE,
        loss_type="dapo",
        beta=0.0,
        use_bias_correction_kl=False,  # the paper's and verl's plain k3 (FlowGRPOConfig's)
        epsilon=0.2,
        epsilon_high=0.3,
        max_completion_length=16,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        gradient_checkpointing=False,
        use_cpu=True,
        seed=0,
        bf16=False,
        disable_tqdm=True,
    )
    values.update(overrides)
    return GRPOConfig(**values)


class KeepGradients(TrainerCallback):  # type: ignore[misc]
    """Keep a copy of the gradient each optimizer step is about to apply."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        model = kwargs["model"]
        self.steps.append(
            {
                name: param.grad.detach().clone()
                for name, param in model.named_parameters()
                if param.grad is not None
            }
        )


def relative_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Return |a - b| / |b| over all tensors (keys must match)."""
    assert sorted(a) == sorted(b)
    diff = sum(float((a[k] - b[k]).pow(2).sum()) for k in b) ** 0.5
    return diff / max(sum(float(b[k].pow(2).sum()) for k in b) ** 0.5, 1e-30)


def perturb(model: Any, seed: int, scale: float = 0.05) -> None:
    """Move every weight a little, so the trained model differs from its frozen KL reference."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(scale * torch.randn(param.shape, generator=generator))
