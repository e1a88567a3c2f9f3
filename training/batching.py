"""The batching rule: a step's rollouts, in micro-batches, in one or several updates.

TRL's data loader hands each process `per_device_train_batch_size x steps_per_generation`
prompts per generation batch; for the flow that is questions_per_step x num_generations
rollouts (G per question). Their rows (one per planner turn, so a varying number) are trained
in `steps_per_generation` micro-steps, `gradient_accumulation_steps` of them per optimizer
step: one update per generation batch (the paper) when the two are equal, several (the
official code's mini-batches) when steps_per_generation is a multiple. A micro-step's rows go
through the model at most per_device_train_batch_size at a time.
"""

from __future__ import annotations

from typing import Any

VERL_DUAL_CLIP = 3.0
"""verl v0.5.0's `clip_ratio_c`, which the official code keeps: for a negative advantage the
loss is capped at -A x 3. TRL's `delta` caps the ratio at 3 for both signs, the same loss
whenever 1 + epsilon_high < 3 (a positive advantage's ratio is clipped lower already)."""


def resolve_batching(
    rollouts: int, per_device: int | None, steps: int | None, accumulation: int
) -> tuple[int, int]:
    """Return `(per_device_train_batch_size, steps_per_generation)` for `rollouts` per process.

    Unset, the per-device batch is the rollouts of one micro-step, and steps_per_generation is
    gradient_accumulation_steps (TRL's default: one update per generation batch).

    Raises:
        ValueError: the rollouts do not split evenly, the split leaves open whether it means
            accumulation or several updates, or an update would span two generation batches.

    """
    if per_device is None:
        steps = steps or accumulation
        if rollouts % steps:
            raise ValueError(
                f"the {rollouts} rollouts a process trains per step (questions_per_step x "
                f"num_generations) do not split into {steps} micro-steps (steps_per_generation, "
                f"default gradient_accumulation_steps={accumulation})"
            )
        per_device = rollouts // steps
    elif per_device < 1 or rollouts % per_device:
        raise ValueError(
            f"per_device_train_batch_size={per_device} does not divide the {rollouts} rollouts "
            "a process trains per step (questions_per_step x num_generations)"
        )
    micro = rollouts // per_device
    if steps is None and micro != accumulation:
        raise ValueError(
            f"per_device_train_batch_size={per_device} splits the {rollouts} rollouts of a step "
            f"into {micro} micro-steps: set gradient_accumulation_steps={micro} for one update "
            f"per step (the paper), or steps_per_generation={micro} for {micro} // "
            "gradient_accumulation_steps updates (the official code's mini-batches)"
        )
    steps = micro if steps is None else steps
    if steps != micro:
        raise ValueError(
            f"steps_per_generation={steps} x per_device_train_batch_size={per_device} is not "
            f"the {rollouts} rollouts a process trains per step"
        )
    check_updates(steps, accumulation)
    return per_device, steps


def check_updates(steps: int, accumulation: int) -> None:
    """Refuse an update that would span two generation batches (or part of one)."""
    if accumulation < 1 or steps % accumulation:
        raise ValueError(
            f"steps_per_generation={steps} is not a multiple of gradient_accumulation_steps="
            f"{accumulation}: an update must not span two generation batches"
        )


def check_trainer_batching(args: Any) -> None:
    """Refuse a `GRPOConfig` whose batching the trainer cannot honour."""
    check_updates(int(args.steps_per_generation or 1), int(args.gradient_accumulation_steps))
