"""Flow-GRPO: turn rewarded trajectories into per-turn training rows.

Why it looks like this:
1. The outcome reward of a whole trajectory is the only signal; every planner turn of
   trajectory i gets the same group-normalised advantage A_i (the broadcast, paper Eq. 7).
2. Turns are trained as separate samples with their own exact prompt and completion ids, so a
   multi-turn rollout never has to be re-tokenised into one sequence.
3. `token_weight` carries the loss normalisation of each mode, so the trainer only has to sum
   token_weight * per-token objective; for `paper` (Eq. 10) each question weighs 1/Q, each of
   its G trajectories 1/G, each of a trajectory's T_i turns 1/T_i and each of a turn's |a|
   tokens 1/|a|, so a long trajectory never outweighs a short one. The advantages and weights
   of each mode are computed in `flowlearn.training.weights`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from flowlearn.nodes.schema.records import Transition
from flowlearn.nodes.schema.sampling import Sampling
from flowlearn.training.provenance import drop_groups, group_trajectories, kept_turns, with_rows
from flowlearn.training.trajectory import Trajectory
from flowlearn.training.weights import MODES as MODES
from flowlearn.training.weights import advantages as _advantages
from flowlearn.training.weights import assign_weights as _assign_weights
from flowlearn.training.weights import check_mode
from flowlearn.training.weights import std as _std

Mode = Literal["paper", "verl_like", "sequence"]
Scale = Literal["group", "batch", "none"]
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
    position: int = 0
    """The turn's 0-based index among its trajectory's kept turns: its identity in the
    trajectory, since two nodes may carry tokens in the same turn."""
    policy_version: str | None = None
    """The version of the policy that sampled it (with the planner on a server: the adapter)."""
    token_scales: list[float] | None = None
    """Per-token factors on the advantage: the importance weights of a stale row
    (`flowlearn.training.stale_rows`); None: 1."""


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
    sampling: Sampling | None = None,
) -> FlowGRPOBatch:
    """Build Flow-GRPO rows from rewarded trajectories grouped by `group_id`.

    Args:
        trajectories: rollouts, G per group; `total_reward` is the outcome.
        mode: `paper` (Eq. 10 weights, default), `verl_like` (the official code: the turns of a
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
        sampling: the trainer's sampling; a row recorded with another temperature, or with
            processed logprobs under top-p < 1, is refused (`provenance.check_sampling`).

    Raises:
        ValueError: unknown mode or scale, a transition without token ids, or one whose
            recorded sampling does not match `sampling`.

    """
    check_mode(mode)
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; use one of {SCALES}")
    stats: dict[str, Any] = {"rows_cut": 0, "rows_dropped": 0, "trajectories_dropped": 0}
    groups = group_trajectories(trajectories, stats)
    stats["groups"] = len(groups)
    turns = kept_turns(groups, nodes, max_prompt_length, sampling, stats)
    zero_variance = {g for g, m in groups.items() if len({t.total_reward for t in m}) == 1}
    stats["zero_variance_share"] = len(zero_variance) / len(groups) if groups else 0.0
    if drop_zero_variance:
        groups = drop_groups(groups, zero_variance, turns, stats)
    advantages = _advantages(groups, turns, mode, scale, eps)
    rows = _rows(groups, turns, advantages, max_completion_length, stats)
    if step_credit is not None:
        stats["step_groups"] = _add_step_credit(rows, turns, groups, step_credit, eps)
    # A trajectory with no kept rows stays in the advantage statistics above: its reward is a
    # sample of the policy's outcome on the question, and leaving it out would bias the
    # baseline (over-long prompts that go with failures would raise the mean). It is left out
    # of Eq. 10's G: it has no tokens to weigh, so counting it would only shrink the weight
    # of the others and the question's total below 1/Q, as an empty question is left out of Q.
    _assign_weights(rows, with_rows(groups, turns, stats), mode)
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
            for position, transition in enumerate(turns[trajectory.trajectory_id]):
                # Rows share the transitions' id lists (read-only downstream): no copies.
                completion = transition.get("completion_ids") or []
                logprobs = transition.get("logprobs") or []
                if max_completion_length and len(completion) > max_completion_length:
                    completion = completion[:max_completion_length]
                    logprobs = logprobs[:max_completion_length]
                    stats["rows_cut"] += 1
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
                        position=position,
                        policy_version=transition.get("policy_version"),
                    )
                )
    return rows


def _add_step_credit(
    rows: list[FlowGRPORow],
    turns: dict[str, list[Transition]],
    groups: dict[str, list[Trajectory]],
    credit: StepCredit,
    eps: float,
) -> int:
    """Add normalised discounted returns within step groups; return how many groups had > 1."""
    rewards = {t.trajectory_id: t.total_reward for m in groups.values() for t in m}
    returns: dict[tuple[str, tuple[int, ...]], list[tuple[FlowGRPORow, float]]] = defaultdict(list)
    for row in rows:  # keyed by position: two nodes may share a turn number
        remaining = len(turns[row.trajectory_id]) - 1 - row.position
        value = credit.gamma**remaining * rewards[row.trajectory_id]
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
