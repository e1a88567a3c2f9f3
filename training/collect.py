"""Collect G rollouts per question through the real flow, reward them, store them."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowlearn.evals.cases import Case
from flowlearn.evals.runner import run_resumable
from flowlearn.evals.scorers import CaseScorer
from flowlearn.nodes.secrets import error_text
from flowlearn.training.store import TrajectoryStore
from flowlearn.training.trajectory import Trajectory, trajectory_from_state

RewardTerm = Callable[[Trajectory], float]
REWARD_ERROR_POLICIES = ("zero", "drop")


def format_penalty(weight: float = 0.1) -> RewardTerm:
    """Return a reward term of `-weight` times the share of planner turns that did not parse."""

    def penalty(trajectory: Trajectory) -> float:
        turns = [t for t in trajectory.transitions if t["node"] == "planner"]
        bad = sum(t["parse_status"] != "ok" for t in turns)
        return -weight * bad / len(turns) if turns else 0.0

    return penalty


def rollout_id(case: Case, index: int, prefix: str = "", run_id: str | None = None) -> str:
    """Return the id of rollout `index` of `case`; being fixed, it makes collection resumable.

    A training rollout is `step{k}:{case}/{i}@{run_id}`: the run id keeps one run's stored
    rollouts from ever being taken for another's.
    """
    return f"{prefix}{case.id}/{index}" + (f"@{run_id}" if run_id else "")


def collect(
    graph_factory: Any,
    cases: Sequence[Case],
    scorer: CaseScorer,
    *,
    group_size: int,
    store: TrajectoryStore | None = None,
    concurrency: int = 4,
    context: Any = None,
    extra_rewards: Mapping[str, RewardTerm] | None = None,
    progress: bool = True,
    id_prefix: str = "",
    reward_errors: str = "zero",
    run_id: str | None = None,
) -> list[Trajectory]:
    """Run `group_size` rollouts of every case, reward each, and append them to `store`.

    Args:
        graph_factory: a compiled graph, or a zero-argument function returning one.
        cases: questions with references; their ids become the `group_id`s.
        scorer: `(answer, case) -> Score`; its value is the trajectory's `reward`.
        group_size: G, the rollouts per question.
        store: where finished trajectories go; rollouts already in it are not run again.
        concurrency: rollouts in flight at once (threads).
        context: the graph's `Context`; with a `seed`, rollout k of a group uses `seed + k`.
        extra_rewards: named reward terms kept in `reward_terms`, e.g. `format_penalty()`.
        progress: show a tqdm progress bar.
        id_prefix: prepended to trajectory ids, e.g. the training step, so a question seen
            again in a later step gets fresh rollouts.
        reward_errors: what a failed scorer or reward term means for the returned list:
            `zero` keeps the trajectory with reward 0, `drop` leaves it out (training then
            never sees it). Either way it is stored, marked with `reward_error`.
        run_id: the training run's id, appended to trajectory ids and kept in `metadata`.

    Returns the trajectories of `cases`, stored ones included, in case and rollout order.
    A scorer or reward-term failure is recorded on the trajectory (reward 0), never raised;
    a crashed rollout is logged and left out, and the next `collect` retries it.

    """
    _check_collect(cases, group_size, reward_errors)
    graph = graph_factory if hasattr(graph_factory, "invoke") else graph_factory()
    stored = {t.trajectory_id: t for t in store} if store is not None else {}
    work = {
        rollout_id(case, k, id_prefix, run_id): (case, k)
        for case in cases
        for k in range(group_size)
    }

    def run_one(item: tuple[Case, int]) -> Trajectory:
        case, k = item
        return run_rollout(graph, case, k, scorer, context, extra_rewards, id_prefix, run_id)

    fresh = run_resumable(
        work,
        run_one,
        done=stored,
        save=store.append if store is not None else None,
        concurrency=concurrency,
        progress=progress,
        label="rollouts",
        unit="traj",
    )
    merged = {**stored, **fresh}
    return [
        merged[rid]
        for rid in work
        if rid in merged and not (reward_errors == "drop" and merged[rid].reward_error is not None)
    ]


def _check_collect(cases: Sequence[Case], group_size: int, reward_errors: str) -> None:
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if reward_errors not in REWARD_ERROR_POLICIES:
        raise ValueError(
            f"unknown reward_errors {reward_errors!r}; use one of {REWARD_ERROR_POLICIES}"
        )
    ids = [case.id for case in cases]
    if len(set(ids)) != len(ids):
        raise ValueError("case ids must be unique: they are the GRPO group ids")
    empty = [case.id for case in cases if not str(case.query).strip()]
    if empty:
        raise ValueError(
            f"cases {empty[:10]} have an empty query; give each a question or remove it"
        )


def run_rollout(
    graph: Any,
    case: Case,
    k: int,
    scorer: CaseScorer,
    context: Any = None,
    extra_rewards: Mapping[str, RewardTerm] | None = None,
    id_prefix: str = "",
    run_id: str | None = None,
) -> Trajectory:
    """Run rollout `k` of `case` through the graph and reward it (not stored)."""
    run_context = context
    if context is not None and getattr(context, "seed", None) is not None:
        run_context = dataclasses.replace(context, seed=context.seed + k)
    start = time.perf_counter()
    state = graph.invoke({"question": case.query}, context=run_context)
    metadata = {"case_metadata": case.metadata, "wall_seconds": time.perf_counter() - start}
    trajectory = trajectory_from_state(
        state,
        trajectory_id=rollout_id(case, k, id_prefix, run_id),
        group_id=case.id,
        reference=case.reference,
        context=run_context.to_dict() if hasattr(run_context, "to_dict") else {},
        metadata={**metadata, "run_id": run_id} if run_id else metadata,
    )
    reward(trajectory, case, scorer, extra_rewards or {})
    return trajectory


def reward(
    trajectory: Trajectory,
    case: Case,
    scorer: CaseScorer,
    extra: Mapping[str, RewardTerm],
) -> None:
    """Score the trajectory's answer into `reward`, and each extra term into `reward_terms`."""
    try:
        score = scorer(trajectory.answer, case)
        trajectory.reward, trajectory.reward_reason = score.value, score.reason
    except Exception as exc:  # a failing judge marks the trajectory; it never stops collection
        trajectory.reward, trajectory.reward_error = 0.0, error_text(exc)
    for name, term in extra.items():
        try:
            trajectory.reward_terms[name] = float(term(trajectory))
        except Exception as exc:
            trajectory.reward_terms[name] = 0.0
            trajectory.reward_error = f"{name}: {error_text(exc)}"
