"""Which transitions may become Flow-GRPO rows, and the counts of what was left out.

Why it looks like this:
1. The logged logprobs are the old policy's only if they describe the distribution the trainer
   scores: TRL's forward is `log_softmax(logits / temperature)` over the whole vocabulary (its
   `top_p` only reaches generation). So a row must have been sampled at the trainer's
   temperature, and its logprobs must not be renormalised over a top-p nucleus, as a server's
   processed logprobs are (`logprobs_mode` in the recorded sampling). Such rows sit off the
   clip range before any update; they are refused, never trained on, wherever they come from:
   fresh rollouts, stored ones reused on resume, or an offline file.
2. A top-p below 1 with full-distribution logprobs (`HFPolicy`, raw logprobs at temperature 1)
   is accepted: the ratio is then the one TRL's own vLLM path uses.
3. A transition without recorded sampling (hand-built data) cannot be checked and is accepted.
4. Every row or trajectory left out is counted (`rows_dropped`, `trajectories_dropped`), so a
   step that trains on less than it rolled out says so in the metrics.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from flowlearn.nodes.schema.records import Transition, token_faithful
from flowlearn.nodes.schema.sampling import Sampling
from flowlearn.training.trajectory import Trajectory

DROPPED = "dropped"
"""A trajectory whose `metadata[DROPPED]` is set (the reason) is left out of training, counted."""


def where(transition: Transition) -> str:
    """Name a transition in a message: its trajectory, turn and node."""
    return (
        f"{transition['node']} transition of trajectory {transition.get('trajectory_id')!r} "
        f"turn {transition['turn']}"
    )


def check_faithful(transition: Transition) -> None:
    """Refuse a transition without the token ids and logprobs training needs."""
    if not token_faithful(transition):
        raise ValueError(
            f"{where(transition)} has no token ids/logprobs: its policy was a plain chat model "
            "(inference only). Collect rollouts with HFPolicy (or another token-faithful "
            "Policy) to train on them; text is never re-tokenised."
        )


def check_sampling(transition: Transition, trainer: Sampling) -> None:
    """Refuse a transition whose recorded sampling the trainer's logprobs cannot reproduce.

    Args:
        transition: a token-faithful transition, with its `sampling` as recorded.
        trainer: the trainer's sampling (its temperature and top_p).

    Raises:
        ValueError: a recorded temperature other than the trainer's, processed logprobs with
            a top-p below 1, or raw logprobs at a temperature other than 1, naming the
            trajectory, turn, recorded and trainer values.

    """
    recorded = transition.get("sampling") or {}
    temperature = recorded.get("temperature")
    if temperature is not None and not math.isclose(
        float(temperature), trainer.temperature, rel_tol=1e-9, abs_tol=1e-12
    ):
        raise ValueError(
            f"{where(transition)} was sampled at temperature {temperature}, the trainer scores "
            f"at temperature {trainer.temperature}: its logprobs are not the old policy's "
            f"(ratios start far from 1, many tokens clipped). Train with temperature "
            f"{temperature}, or collect again at {trainer.temperature}"
        )
    top_p = float(recorded.get("top_p", trainer.top_p))
    mode = recorded.get("logprobs_mode")
    if mode == "processed" and top_p < 1:
        raise ValueError(
            f"{where(transition)} has processed logprobs (renormalised over the top-p {top_p} "
            f"nucleus) but the trainer scores the full distribution (trainer top_p "
            f"{trainer.top_p} applies to sampling only): every ratio starts below 1, on the clip "
            "floor. Collect with top_p 1, or at temperature 1 with raw logprobs "
            "(ServerPolicy logprobs_mode='raw', vLLM --logprobs-mode raw_logprobs)"
        )
    if mode == "raw" and temperature is not None and float(temperature) not in (0.0, 1.0):
        raise ValueError(
            f"{where(transition)} has raw logprobs (before temperature) but was sampled at "
            f"temperature {temperature} (trainer: {trainer.temperature}): they are not the "
            "sampling distribution's; serve with --logprobs-mode processed_logprobs"
        )


def group_trajectories(
    trajectories: Iterable[Trajectory], stats: dict[str, Any]
) -> dict[str, list[Trajectory]]:
    """Group by question, leaving out (and counting) trajectories marked `metadata[DROPPED]`."""
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        if trajectory.metadata.get(DROPPED):
            stats["trajectories_dropped"] += 1
            continue
        groups.setdefault(trajectory.group_id, []).append(trajectory)
    return groups


def kept_turns(
    groups: dict[str, list[Trajectory]],
    nodes: Sequence[str] | None,
    max_prompt_length: int | None,
    sampling: Sampling | None,
    stats: dict[str, Any],
) -> dict[str, list[Transition]]:
    """Return each trajectory's trainable turns: by node, checked, within the prompt length.

    With `nodes` None, a policy call that carries no token ids (a server that returned none) is
    left out and counted; a call that is not a policy's (no `completion_ids` key) is no row.
    """
    turns: dict[str, list[Transition]] = {}
    for members in groups.values():
        for trajectory in members:
            kept = []
            for transition in trajectory.transitions:
                if nodes is None and transition.get("completion_ids") is None:
                    stats["rows_dropped"] += "completion_ids" in transition
                    continue
                if nodes is not None and transition["node"] not in nodes:
                    continue
                check_faithful(transition)
                if sampling is not None:
                    check_sampling(transition, sampling)
                prompt = transition.get("prompt_ids") or []
                if max_prompt_length and len(prompt) > max_prompt_length:
                    stats["rows_dropped"] += 1
                    continue
                kept.append(transition)
            turns[trajectory.trajectory_id] = kept
    return turns


def drop_groups(
    groups: dict[str, list[Trajectory]],
    dropped: set[str],
    turns: dict[str, list[Transition]],
    stats: dict[str, Any],
) -> dict[str, list[Trajectory]]:
    """Return `groups` without the `dropped` ones, counting their trajectories and rows."""
    for group_id in dropped & set(groups):
        stats["trajectories_dropped"] += len(groups[group_id])
        stats["rows_dropped"] += sum(len(turns[t.trajectory_id]) for t in groups[group_id])
    return {g: m for g, m in groups.items() if g not in dropped}


def with_rows(
    groups: dict[str, list[Trajectory]],
    turns: dict[str, list[Transition]],
    stats: dict[str, Any],
) -> dict[str, list[Trajectory]]:
    """Return each group's trajectories that have kept turns; count the others as dropped."""
    out: dict[str, list[Trajectory]] = {}
    for group_id, members in groups.items():
        trained = [t for t in members if turns[t.trajectory_id]]
        stats["trajectories_dropped"] += len(members) - len(trained)
        if trained:
            out[group_id] = trained
    return out
