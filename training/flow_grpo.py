"""Flow-GRPO: turn rewarded trajectories into per-turn training rows.

Why it looks like this:
1. The outcome reward of a whole trajectory is the only signal; every planner turn of
   trajectory i gets the same group-normalised advantage A_i (the broadcast, paper Eq. 7).
2. Turns are trained as separate samples with their own exact prompt and completion ids, so a
   multi-turn rollout never has to be re-tokenised into one sequence.
3. `token_weight` carries the loss normalisation of each mode, so the trainer only has to sum
   token_weight * per-token objective; for `paper` (Eq. 10) each question weighs 1/Q, each of
   its G trajectories 1/G, each of a trajectory's T_i turns 1/T_i and each of a turn's |a|
   tokens 1/|a|, so a long trajectory never outweighs a short one.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from flowlearn.nodes.schema.records import Transition, token_faithful
from flowlearn.training.trajectory import Trajectory

Mode = Literal["paper", "official", "sequence"]
Scale = Literal["group", "batch", "none"]
MODES = ("paper", "official", "sequence")
SCALES = ("group", "batch", "none")


@dataclass
class FlowGRPORow:
    """One trainable turn."""

    trajectory_id: str
    group_id: str
    turn: int
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float]
    advantage: float
    """The trajectory's advantage, broadcast to every token of this turn."""
    token_weight: float
    """The loss weight of each token of this turn under the chosen mode."""
    reward: float
    node: str = "planner"


@dataclass(frozen=True)
class StepCredit:
    """GiGPO-style step credit, beyond the paper (off unless given).

    Planner turns of the same question that saw the same input (identical prompt ids, i.e. the
    same memory state) form a step group; their discounted returns `gamma^(T_i - t) * R_i` are
    normalised within the step group and added, times `weight`, to the trajectory advantage.
    """

    weight: float = 1.0
    gamma: float = 0.95


@dataclass
class FlowGRPOBatch:
    """Rows plus what happened while building them."""

    rows: list[FlowGRPORow]
    stats: dict[str, Any] = field(default_factory=dict)


def _std(values: Sequence[float]) -> float:
    """Return the population standard deviation (ddof=0; TRL uses the unbiased one)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def _check(transition: Transition) -> None:
    if not token_faithful(transition):
        raise ValueError(
            f"{transition['node']} transition of trajectory "
            f"{transition.get('trajectory_id')!r} turn "
            f"{transition['turn']} has no token ids/logprobs: its policy was a plain chat model "
            "(inference only). Collect rollouts with HFPolicy (or another token-faithful "
            "Policy) to train on them; text is never re-tokenised."
        )


def build_flow_grpo_rows(
    trajectories: Iterable[Trajectory],
    mode: Mode = "paper",
    *,
    nodes: Sequence[str] | None = ("planner",),
    scale: Scale = "group",
    drop_zero_variance: bool = False,
    eps: float = 1e-6,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    step_credit: StepCredit | None = None,
) -> FlowGRPOBatch:
    """Build Flow-GRPO rows from rewarded trajectories grouped by `group_id`.

    Args:
        trajectories: rollouts, G per group; `total_reward` is the outcome.
        mode: `paper` (Eq. 10 weights, default), `official` (the official code: the turns of a
            question pooled for normalisation, token-mean loss) or `sequence` (each row's
            tokens averaged, rows averaged).
        nodes: which nodes' transitions become rows (the planner by default); None: every
            transition that carries token ids, whatever node wrote it.
        scale: divide by the group's std (`group`), the whole batch's std (`batch`), or not
            at all (`none`, Dr. GRPO style).
        drop_zero_variance: drop groups whose rewards are all equal (no signal).
        eps: added to the std.
        max_prompt_length: rows with longer prompts are dropped (counted in the stats).
        max_completion_length: longer completions are cut to this length (counted).
        step_credit: add GiGPO-style step-group advantages (see `StepCredit`); None = paper.

    Raises:
        ValueError: unknown mode or scale, or a transition without token ids.

    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; use one of {MODES}")
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {SCALES}")
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        groups[trajectory.group_id].append(trajectory)
    stats: dict[str, Any] = {"groups": len(groups), "dropped_rows": 0, "cut_rows": 0}
    turns = _kept_turns(groups, nodes, max_prompt_length, stats)
    zero_variance = {g for g, m in groups.items() if len({t.total_reward for t in m}) == 1}
    stats["zero_variance_share"] = len(zero_variance) / len(groups) if groups else 0.0
    if drop_zero_variance:
        groups = {g: m for g, m in groups.items() if g not in zero_variance}
    advantages = _advantages(groups, turns, mode, scale, eps)
    rows = _rows(groups, turns, advantages, max_completion_length, stats)
    if step_credit is not None:
        stats["step_groups"] = _add_step_credit(rows, turns, groups, step_credit, eps)
    _assign_weights(rows, groups, mode)
    members = [t for m in groups.values() for t in m]
    count = len(members) or 1  # the means of no trajectories are 0
    stats.update(
        rows=len(rows),
        tokens=sum(len(r.completion_ids) for r in rows),
        mean_reward=sum(t.total_reward for t in members) / count,
        mean_turns=sum(len(turns[t.trajectory_id]) for t in members) / count,
        trained_groups=len(groups),
    )
    return FlowGRPOBatch(rows, stats)


def _kept_turns(
    groups: dict[str, list[Trajectory]],
    nodes: Sequence[str] | None,
    max_prompt_length: int | None,
    stats: dict[str, Any],
) -> dict[str, list[Transition]]:
    """Return each trajectory's trainable turns: filtered by node and prompt length (counted)."""
    turns: dict[str, list[Transition]] = {}
    for members in groups.values():
        for trajectory in members:
            kept = []
            for transition in trajectory.transitions:
                if nodes is None and transition.get("completion_ids") is None:
                    continue
                if nodes is not None and transition["node"] not in nodes:
                    continue
                _check(transition)
                prompt = transition.get("prompt_ids") or []
                if max_prompt_length and len(prompt) > max_prompt_length:
                    stats["dropped_rows"] += 1
                    continue
                kept.append(transition)
            turns[trajectory.trajectory_id] = kept
    return turns


def _rows(
    groups: dict[str, list[Trajectory]],
    turns: dict[str, list[Transition]],
    advantages: dict[str, float],
    max_completion_length: int | None,
    stats: dict[str, Any],
) -> list[FlowGRPORow]:
    """Return one row per kept turn, completions cut to `max_completion_length` (counted)."""
    rows: list[FlowGRPORow] = []
    for group_id, members in groups.items():
        for trajectory in members:
            for transition in turns[trajectory.trajectory_id]:
                # Rows share the transitions' id lists (read-only downstream): no copies.
                completion = transition.get("completion_ids") or []
                logprobs = transition.get("logprobs") or []
                if max_completion_length and len(completion) > max_completion_length:
                    completion = completion[:max_completion_length]
                    logprobs = logprobs[:max_completion_length]
                    stats["cut_rows"] += 1
                rows.append(
                    FlowGRPORow(
                        trajectory_id=trajectory.trajectory_id,
                        group_id=group_id,
                        turn=transition["turn"],
                        prompt_ids=transition.get("prompt_ids") or [],
                        completion_ids=completion,
                        old_logprobs=logprobs,
                        advantage=advantages[trajectory.trajectory_id],
                        token_weight=0.0,
                        reward=trajectory.total_reward,
                        node=transition["node"],
                    )
                )
    return rows


def _advantages(
    groups: dict[str, list[Trajectory]],
    turns: dict[str, list[Transition]],
    mode: Mode,
    scale: Scale,
    eps: float,
) -> dict[str, float]:
    """A_i = (R_i - mean) / (std + eps) per trajectory; `official` pools the group's turns."""

    def samples(members: list[Trajectory]) -> list[float]:
        if mode == "official":  # every turn-sample counts once in the statistics
            return [t.total_reward for t in members for _ in turns[t.trajectory_id]] or [
                t.total_reward for t in members
            ]
        return [t.total_reward for t in members]

    batch = [r for members in groups.values() for r in samples(members)]
    batch_std = _std(batch) if batch else 0.0
    out: dict[str, float] = {}
    for members in groups.values():
        values = samples(members)
        mean = sum(values) / len(values)
        denominator = {"group": _std(values) + eps, "batch": batch_std + eps, "none": 1.0}[scale]
        for trajectory in members:
            out[trajectory.trajectory_id] = (trajectory.total_reward - mean) / denominator
    return out


def _add_step_credit(
    rows: list[FlowGRPORow],
    turns: dict[str, list[Transition]],
    groups: dict[str, list[Trajectory]],
    credit: StepCredit,
    eps: float,
) -> int:
    """Add normalised discounted returns within step groups; return how many groups had > 1."""
    rewards = {t.trajectory_id: t.total_reward for m in groups.values() for t in m}
    position = {
        (tid, transition["turn"]): (index, len(kept))
        for tid, kept in turns.items()
        for index, transition in enumerate(kept, 1)
    }
    returns: dict[tuple[str, tuple[int, ...]], list[tuple[FlowGRPORow, float]]] = defaultdict(list)
    for row in rows:
        index, total = position[(row.trajectory_id, row.turn)]
        value = credit.gamma ** (total - index) * rewards[row.trajectory_id]
        returns[(row.group_id, tuple(row.prompt_ids))].append((row, value))
    shared = 0
    for members in returns.values():
        if len(members) < 2:
            continue
        shared += 1
        values = [value for _, value in members]
        mean, std = sum(values) / len(values), _std(values)
        for row, value in members:
            row.advantage += credit.weight * (value - mean) / (std + eps)
    return shared


def _assign_weights(
    rows: list[FlowGRPORow], groups: dict[str, list[Trajectory]], mode: Mode
) -> None:
    """Set token weights so that sum(token_weight * objective) is the mode's objective."""
    if not rows:
        return
    if mode == "official":  # token mean over the whole batch
        tokens = sum(len(r.completion_ids) for r in rows)
        for row in rows:
            row.token_weight = 1.0 / tokens if tokens else 0.0
        return
    if mode == "sequence":
        for row in rows:
            row.token_weight = 1.0 / (len(rows) * max(len(row.completion_ids), 1))
        return
    rows_per_trajectory: dict[str, int] = defaultdict(int)
    for row in rows:
        rows_per_trajectory[row.trajectory_id] += 1
    size = {group_id: len(members) for group_id, members in groups.items()}
    questions = len({row.group_id for row in rows})
    for row in rows:
        row.token_weight = 1.0 / (
            questions
            * size[row.group_id]
            * rows_per_trajectory[row.trajectory_id]
            * max(len(row.completion_ids), 1)
        )
