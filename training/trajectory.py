"""Trajectories: one rollout with its outcome, holding the transitions training consumes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, cast

from flowlearn.nodes.schema.records import Transition

SCHEMA_VERSION = 2
"""2: `steps` became `turns` (planner turns); version-1 records still load."""


@dataclass
class Trajectory:
    """One rollout of the flow on one question, with its outcome and reward."""

    trajectory_id: str
    group_id: str
    question: str
    reference: Any
    answer: str
    final_text: str
    reward: float
    """The case's scorer applied to `answer`, in [0, 1]."""
    reward_terms: dict[str, float] = field(default_factory=dict)
    """Extra reward terms (e.g. a format penalty), kept apart; `total_reward` adds them."""
    reward_reason: str = ""
    reward_error: str | None = None
    """Set when the scorer failed; the trajectory is kept and marked."""
    turns: int = 0
    """Planner turns taken, format errors included."""
    termination: str | None = None
    seconds: float = 0.0
    memory: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def total_reward(self) -> float:
        """The reward plus every extra term: what the advantage is computed from."""
        return self.reward + sum(self.reward_terms.values())

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serializable dict (transitions included)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """Rebuild a trajectory from `to_dict` output, checking the schema version.

        Raises:
            ValueError: a newer schema version than this code reads, or missing fields.

        """
        version = data.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"trajectory schema version {version} is newer than this flowlearn reads "
                f"({SCHEMA_VERSION}); upgrade flowlearn"
            )
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if version < 2 and "steps" in data:
            values["turns"] = data["steps"]
        values["schema_version"] = SCHEMA_VERSION
        values["transitions"] = [cast(Transition, dict(t)) for t in values.get("transitions", [])]
        return cls(**values)

    def to_json(self) -> str:
        """Return the trajectory as one JSON line."""
        return json.dumps(self.to_dict(), ensure_ascii=False, default=str)


def trajectory_from_state(
    state: dict[str, Any],
    *,
    trajectory_id: str,
    group_id: str,
    reference: Any,
    context: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Trajectory:
    """Turn the flow's final state into an (as yet unrewarded) trajectory."""
    transitions = [
        cast(Transition, {**t, "trajectory_id": trajectory_id, "group_id": group_id})
        for t in state.get("transitions", [])
    ]
    return Trajectory(
        trajectory_id=trajectory_id,
        group_id=group_id,
        question=state.get("question", ""),
        reference=reference,
        answer=state.get("answer", ""),
        final_text=state.get("final_text", ""),
        reward=0.0,
        turns=state.get("turn", 0),
        termination=state.get("termination"),
        seconds=state.get("seconds", 0.0),
        memory=[dict(r) for r in state.get("memory", [])],
        transitions=transitions,
        context=context or {},
        metadata=metadata or {},
    )
