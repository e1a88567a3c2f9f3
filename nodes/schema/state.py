"""The shared memory of the flow: the graph state every agent reads and writes."""

from __future__ import annotations

import operator
from typing import Annotated, Literal

# typing_extensions, not typing: pydantic (LangGraph's input and output JSON schemas, Studio's
# form) refuses `typing.TypedDict` on Python < 3.12.
from typing_extensions import TypedDict

from flowlearn.nodes.schema.records import Plan, StepRecord, Transition

Termination = Literal["verifier_stop", "max_turns", "max_seconds", "engine_error"]


class InputState(TypedDict):
    """What a caller passes to run the flow."""

    question: str
    """The question to answer, as the user wrote it."""


class State(InputState, total=False):
    """The full shared memory of one run.

    List fields are append-only (their reducer concatenates), so every node adds to the record
    and nothing a node wrote is lost when another node runs.
    """

    analysis: str
    """Query analysis written on the planner's first visit: goal, skills, relevant tools."""
    memory: Annotated[list[StepRecord], operator.add]
    """Step records in order: actions (sub-goal, tool, arguments, result, error, seconds),
    planner format errors, and the verifier's analyses and verdicts."""
    plan: Plan | None
    """The planner's latest decision; None after a turn whose output did not parse."""
    verdict: Literal["STOP", "CONTINUE"]
    """The verifier's latest verdict."""
    final_text: str
    """The generator's full output."""
    answer: str
    """The answer from `final_text`: its last `<answer>` pair, else the fallbacks of
    `nodes.parsing` (an opened tag, an "The answer is X" line, the last non-empty line)."""
    turn: int
    """Planner turns taken so far, format errors included."""
    transitions: Annotated[list[Transition], operator.add]
    """Every model call of every node, with rendered messages, output, parse status and timing;
    planner calls also carry token ids and logprobs when the policy provides them."""
    started_at: float
    """Wall-clock time (`time.time()`) when the planner first ran; the `max_seconds` budget
    counts from here."""
    seconds: float
    """Wall-clock seconds from `started_at` to the final answer."""
    termination: Termination | None
    """Why the loop ended: the verifier said STOP, or a budget was spent."""


class OutputState(TypedDict, total=False):
    """What an API client gets back: `build_agentflow(output_schema=OutputState)`.

    The question, the answer and how the run went, with memory as the agents wrote it; no
    token ids, prompts or logprobs (those stay in the checkpointed state, for training).
    """

    question: str
    answer: str
    final_text: str
    termination: Termination | None
    turn: int
    seconds: float
    memory: list[StepRecord]
    """The step records: sub-goals, tools, arguments, results, errors and verdicts."""
