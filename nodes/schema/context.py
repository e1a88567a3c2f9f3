"""Run-scoped settings: a JSON-serializable dataclass passed as the graph's `context`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from flowlearn.engine.sampling import Sampling

_PLANNER = Sampling()
"""The planner's sampling defaults, declared once in `Sampling`."""

MAX_TURNS = 100
"""The most planner turns a run may take (the paper: 10 at inference, 3 in training)."""
MAX_SECONDS = 7 * 24 * 3600.0
"""The longest wall-clock budget a run may have: a week."""
MIN_SECONDS = 0.1
"""The shortest: the budget is checked before each turn, and a turn once started runs to its
end, so a budget shorter than any model call (`1e-300`) would only let the first turn overrun it."""
QUESTION_CHARS = 100_000
"""The default bound on a question's characters (`Context.max_question_chars`).

Checked before anything tokenises the question: tokenising costs about 350 bytes a token, so a
4 MB question once grew a run by 1.4 GB and a 40 MB one killed the server. 100,000 characters
is about 25,000 tokens: beyond the window of the embedded model (8k) and of most planners, and
some twenty times the longest question of the registered benchmarks."""
MAX_QUESTION_CHARS = 1_000_000
"""The most `max_question_chars` may be raised to (about 250,000 tokens, some 90 MB to
tokenise), and the bound on any question a data file holds."""
MAX_RESULT_CHARS = 1_000_000
"""The most characters of one tool result kept in memory."""
MAX_TOOL_TIMEOUT_S = 3600.0
"""The longest a tool call may run: an hour."""


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
            "AgentFlow infers; rollouts to train on sample, as `flowlearn collect` and "
            "`flowlearn train` do by default)."
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
    max_question_chars: int = field(
        default=QUESTION_CHARS,
        metadata={
            "description": "A longer question is refused before it is tokenised (at most "
            f"{MAX_QUESTION_CHARS:,})."
        },
    )

    def __post_init__(self) -> None:
        # Every bound is named in its message: a run, or a Studio form, that asks for 1e22
        # turns or a 1e12-character result would run or allocate until killed.
        if not _whole(self.max_turns) or not 1 <= self.max_turns <= MAX_TURNS:
            raise ValueError(
                f"max_turns must be a whole number in [1, {MAX_TURNS}], got {self.max_turns!r}"
            )
        if self.max_seconds is not None and not _positive(self.max_seconds, MAX_SECONDS):
            # NaN compares false with everything, so `<= 0` let it through and switched the
            # budget off; inf is "no limit" in disguise: None says that.
            raise ValueError(
                "max_seconds must be > 0 (a finite number of seconds) and at most "
                f"{MAX_SECONDS:g} (a week), or None for no limit; got {self.max_seconds!r}"
            )
        if self.max_seconds is not None and self.max_seconds < MIN_SECONDS:
            raise ValueError(
                f"max_seconds {self.max_seconds!r} is below {MIN_SECONDS:g}: the budget is "
                "checked before each turn, so the first turn would run past it; give at least "
                f"{MIN_SECONDS:g} seconds, or None for no limit"
            )
        try:
            self.planner_sampling()
        except ValueError as exc:
            raise ValueError(f"planner {exc}") from None
        if (
            not _whole(self.max_result_chars)
            or not 100 <= self.max_result_chars <= MAX_RESULT_CHARS
        ):
            raise ValueError(
                f"max_result_chars must be a whole number in [100, {MAX_RESULT_CHARS}], "
                f"got {self.max_result_chars!r}"
            )
        if (
            not _whole(self.max_question_chars)
            or not 1 <= self.max_question_chars <= MAX_QUESTION_CHARS
        ):
            raise ValueError(
                f"max_question_chars must be a whole number in [1, {MAX_QUESTION_CHARS}], "
                f"got {self.max_question_chars!r}"
            )
        if not _positive(self.tool_timeout_s, MAX_TOOL_TIMEOUT_S):
            raise ValueError(
                "tool_timeout_s must be > 0 (a finite number of seconds) and at most "
                f"{MAX_TOOL_TIMEOUT_S:g}, got {self.tool_timeout_s!r}"
            )
        for name in ("query_analysis", "approve_tools"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "query_analysis" and value is None):
                # "false" from a form or a YAML file would read true
                nullable = " or null" if name == "query_analysis" else ""
                raise ValueError(f"{name} must be true or false{nullable}, got {value!r}")
        if self.tools is not None:
            if isinstance(self.tools, str) or not all(isinstance(t, str) for t in self.tools):
                raise ValueError(f"tools must be a list of tool names, got {self.tools!r}")
            names = tuple(t.strip() for t in self.tools)
            if not names or not all(names):
                # an empty list once meant "every tool", python included
                raise ValueError(
                    f"tools must name at least one tool (none named: {self.tools!r}); leave it "
                    "unset (None) to enable every bound tool"
                )
            object.__setattr__(self, "tools", names)

    def check_question(self, question: object) -> str:
        """Return `question` if the run may take it: text, not blank, within `max_question_chars`.

        Checked on its length alone, before anything tokenises it.

        Raises:
            ValueError: a question that is not text, is blank, or is too long, saying the fix.

        """
        if not isinstance(question, str):
            raise ValueError(
                f"the question must be text, got {type(question).__name__}: invoke the graph "
                "with {'question': '...'}"
            )
        if len(question) > self.max_question_chars:
            raise ValueError(question_too_long(len(question), self.max_question_chars))
        if not question.strip():
            raise ValueError("the question is empty: invoke the graph with a non-empty 'question'")
        return question

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


def question_too_long(length: int, limit: int) -> str:
    """Say that a question of `length` characters is over `limit`, and what to do."""
    fix = (
        "shorten it, or raise the context's max_question_chars (--max-question-chars), at most "
        f"{MAX_QUESTION_CHARS:,}"
        if limit < MAX_QUESTION_CHARS
        else "shorten it"
    )
    return (
        f"the question has {length:,} characters, more than the {limit:,} a run takes "
        f"(max_question_chars; it is refused before tokenising); {fix}"
    )


def _positive(value: object, most: float = math.inf) -> bool:
    """Whether `value` is a finite real number above 0 and at most `most` (never a bool)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= most
    )


def _whole(value: object) -> bool:
    """Whether `value` is an int (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


TRAINING_CONTEXT = Context(max_turns=3, planner_temperature=0.7, planner_max_new_tokens=512)
"""The run context of rollouts sampled to train on, where nothing else is said: declared once.

The paper trains with 3 planner turns; the rollouts sample (AgentFlow's 0.7) where a run is
greedy, since a group of equal rollouts teaches nothing; a planner turn may take 512 tokens.
`FlowGRPOConfig` (`max_turns`, TRL's `temperature` and `max_completion_length`), its
`context()` and `flowlearn collect`'s flags take their defaults from here; every other setting
is `Context`'s own default.
"""
