"""Planner turns and rollouts for the provenance tests, and the trainer's sampling settings."""

from __future__ import annotations

from typing import Any

from flowlearn.engine.sampling import Sampling
from flowlearn.training import Trajectory, Transition

TRAINER = Sampling(temperature=0.7, top_p=1.0)


def turn(
    tid: str, t: int, *, node: str = "planner", length: int = 3, **sampling: Any
) -> Transition:
    record = Transition(
        trajectory_id=tid,
        group_id="g",
        node=node,
        turn=t,
        messages=[],
        output="",
        parse_status="ok",
        seconds=0.0,
        prompt_ids=[1, 2, 3],
        completion_ids=list(range(length)),
        logprobs=[-0.1] * length,
    )
    if sampling:
        record["sampling"] = {"temperature": 0.7, "top_p": 1.0, **sampling}
    return record


def rollout(tid: str, reward: float, transitions: list[Transition]) -> Trajectory:
    return Trajectory(
        trajectory_id=tid,
        group_id="g",
        question="q",
        reference="r",
        answer="a",
        final_text="a",
        reward=reward,
        transitions=transitions,
    )
