"""Run-scoped settings: a JSON-serializable dataclass passed as the graph's `context`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from flowlearn.engine.sampling import Sampling

_PLANNER = Sampling()
"""The planner's sampling defaults, declared once in `Sampling`."""


@dataclass(frozen=True, kw_only=True)
class Context:
    """Settings of one run, passed as `graph.invoke(inputs, context=Context(...))`.

    Heavy objects (policy, chat models, tools) are bound when the graph is built, never here:
    Studio shows this dataclass as a JSON form.
    """

    max_turns: int = field(
        default=10,
        metadata={"description": "Planner turns allowed (paper: 10 at inference, 3 in training)."},
    )
    max_seconds: float | None = field(
        default=None, metadata={"description": "Wall-clock budget in seconds; None means no limit."}
    )
    planner_temperature: float = field(
        default=_PLANNER.temperature,
        metadata={
            "description": "Sampling temperature of the planner policy (0 = greedy, as "
            "AgentFlow infers; `flowlearn collect` samples at 0.7)."
        },
    )
    planner_top_p: float = field(
        default=_PLANNER.top_p,
        metadata={"description": "Nucleus sampling threshold of the planner policy."},
    )
    planner_max_new_tokens: int = field(
        default=_PLANNER.max_new_tokens,
        metadata={"description": "Most tokens the planner may write per turn."},
    )
    seed: int | None = field(
        default=None,
        metadata={
            "description": "Seed for the planner's sampling (each call draws its own seed from "
            "it, the question and the turn); None = random."
        },
    )
    query_analysis: bool | None = field(
        default=None,
        metadata={
            "description": "Analyse the question before the first plan (the paper's query "
            "analysis, by the fixed engine), shown to the planner and verifier. None: the "
            "prompt set's choice (on for AgentFlow's prompts, off for the smollm2 preset)."
        },
    )
    tools: tuple[str, ...] | None = field(
        default=None,
        metadata={"description": "Names of the bound tools to enable; None enables all of them."},
    )
    approve_tools: bool = field(
        default=False,
        metadata={
            "description": "Pause before every tool call for a human decision (LangGraph "
            "interrupt; needs a checkpointer). Resume with Command(resume=True), False, or "
            '{"arguments": {...}} to run with edited arguments.'
        },
    )
    max_result_chars: int = field(
        default=4000,
        metadata={"description": "Tool results longer than this are cut in memory, with a marker."},
    )
    tool_timeout_s: float = field(
        default=120.0,
        metadata={
            "description": "A tool call still running after this many seconds is recorded as a "
            "timeout error and the flow moves on (the python tool has its own, shorter limit)."
        },
    )

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
        if self.max_seconds is not None and not _positive(self.max_seconds):
            # NaN compares false with everything, so `<= 0` let it through and switched the
            # budget off; inf is "no limit" in disguise: None says that.
            raise ValueError(
                "max_seconds must be > 0 (a finite number of seconds), or None for no limit; "
                f"got {self.max_seconds!r}"
            )
        try:
            self.planner_sampling()
        except ValueError as exc:
            raise ValueError(f"planner {exc}") from None
        if self.max_result_chars < 100:
            raise ValueError(f"max_result_chars must be >= 100, got {self.max_result_chars}")
        if not _positive(self.tool_timeout_s):
            raise ValueError(
                "tool_timeout_s must be > 0 (a finite number of seconds), "
                f"got {self.tool_timeout_s!r}"
            )
        if self.query_analysis is not None and not isinstance(self.query_analysis, bool):
            # "false" from a form would read true
            raise ValueError(
                f"query_analysis must be true, false or null, got {self.query_analysis!r}"
            )
        if self.tools is not None and not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))

    def planner_sampling(self) -> Sampling:
        """Return the planner's sampling settings: the one place they are assembled."""
        return Sampling(
            temperature=self.planner_temperature,
            top_p=self.planner_top_p,
            max_new_tokens=self.planner_max_new_tokens,
            seed=self.seed,
        )

    def to_dict(self) -> dict[str, Any]:
        """Return the settings as a JSON-serializable dict."""
        data = asdict(self)
        if data["tools"] is not None:
            data["tools"] = list(data["tools"])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Context:
        """Build a context from a dict, rejecting unknown keys with the list of known ones."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown context keys {unknown}; known keys are {sorted(known)}")
        return cls(**data)


def _positive(value: object) -> bool:
    """Whether `value` is a finite real number above 0 (not NaN, not inf, not a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )
