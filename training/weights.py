"""Flow-GRPO's numbers per mode: the trajectory advantages and the per-token loss weights.

Why it looks like this:
1. `paper` (Eq. 7 and 10) normalises the outcome rewards within a question's G trajectories
   and weighs each question 1/Q, each trajectory 1/G, each of its T_i turns 1/T_i and each of a
   turn's |a| tokens 1/|a|; `sequence` averages each row's tokens, then the rows.
2. `verl_like` is the arithmetic of the official code, verl v0.5.0: `compute_grpo_outcome_
   advantage` over a question's turn-samples pooled, with the unbiased std and its singleton
   rule; its token mean is taken per micro-batch at training time (`training/layout.py`).
3. The weights here are one process's; training rescales them to the counts of all processes
   (`weight_count`) before the loss.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Protocol

from flowlearn.nodes.schema.records import Transition
from flowlearn.training.trajectory import Trajectory

MODES = ("paper", "verl_like", "sequence")
RENAMED_MODES = {"official": "verl_like"}
"""Old names of modes. `official` was renamed: TRL fixes the number of optimizer steps per
rollout batch, so the mode reproduces verl v0.5.0's arithmetic but not all of its batching
(README, "The `verl_like` mode")."""


def check_mode(mode: str) -> None:
    """Refuse a mode that is not one of `MODES`, naming the new name of a renamed one."""
    refuse_renamed_mode(mode)
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {MODES}")


def refuse_renamed_mode(mode: str) -> None:
    """Refuse a mode's old name (`RENAMED_MODES`), saying its new name and why."""
    if mode in RENAMED_MODES:
        raise ValueError(
            f"mode {mode!r} is now {RENAMED_MODES[mode]!r}: it reproduces the official code's "
            "arithmetic (verl v0.5.0) where TRL can express it; the README's section on the "
            f"{RENAMED_MODES[mode]} mode lists what differs"
        )


class WeightedRow(Protocol):
    """What the weights read and set of a row (`FlowGRPORow`)."""

    trajectory_id: str
    group_id: str
    completion_ids: list[int]
    token_weight: float


def std(values: Sequence[float], ddof: int = 0) -> float:
    """Return the standard deviation: population (ddof=0), or unbiased (ddof=1, torch.std)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - ddof))


def advantages(
    groups: dict[str, list[Trajectory]],
    turns: dict[str, list[Transition]],
    mode: str,
    scale: str,
    eps: float,
) -> dict[str, float]:
    """A_i = (R_i - mean) / (std + eps) per trajectory (population std).

    `verl_like` is verl v0.5.0's `compute_grpo_outcome_advantage`, which the official code
    runs: a question's turn-samples pooled (each carries its trajectory's R), the unbiased std
    (`torch.std`), and a question with a single sample gets mean 0 and std 1.
    """
    verl_like = mode == "verl_like"
    ddof = int(verl_like)

    def samples(members: list[Trajectory]) -> list[float]:
        if verl_like:  # every turn-sample counts once in the statistics
            return [t.total_reward for t in members for _ in turns[t.trajectory_id]] or [
                t.total_reward for t in members
            ]
        return [t.total_reward for t in members]

    batch = [r for members in groups.values() for r in samples(members)]
    batch_std = std(batch, ddof) if len(batch) > ddof else 0.0
    out: dict[str, float] = {}
    for members in groups.values():
        values = samples(members)
        mean, spread = sum(values) / len(values), std(values, ddof) if len(values) > ddof else 0.0
        if verl_like and len(values) == 1:
            mean, spread = 0.0, 1.0
        denominator = {"group": spread + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        for trajectory in members:
            out[trajectory.trajectory_id] = (trajectory.total_reward - mean) / denominator
    return out


def assign_weights(
    rows: Sequence[WeightedRow], groups: dict[str, list[Trajectory]], mode: str
) -> None:
    """Set token weights so that sum(token_weight * objective) is the mode's objective.

    Training rescales them to all processes' `weight_count` and sets `verl_like`'s per
    micro-batch (`flowlearn.training.layout`).
    """
    if not rows:
        return
    count = weight_count(rows, mode)
    if mode == "verl_like":  # token mean over the whole batch
        for row in rows:
            row.token_weight = 1.0 / count if count else 0.0
        return
    if mode == "sequence":
        for row in rows:
            row.token_weight = 1.0 / (count * max(len(row.completion_ids), 1))
        return
    rows_per_trajectory: dict[str, int] = defaultdict(int)
    for row in rows:
        rows_per_trajectory[row.trajectory_id] += 1
    size = {group_id: len(members) for group_id, members in groups.items()}
    for row in rows:
        row.token_weight = 1.0 / (
            count
            * size[row.group_id]
            * rows_per_trajectory[row.trajectory_id]
            * max(len(row.completion_ids), 1)
        )


def weight_count(rows: Sequence[WeightedRow], mode: str) -> int:
    """Return what a mode's weights divide by: questions (paper), rows (sequence), tokens."""
    if mode == "paper":
        return len({row.group_id for row in rows})
    if mode == "sequence":
        return len(rows)
    return sum(len(row.completion_ids) for row in rows)
