"""Records the nodes write into shared memory: the plan, step records and transitions."""

from __future__ import annotations

from typing import Any, Literal, NotRequired

from typing_extensions import TypedDict  # not typing's: pydantic refuses it before Python 3.12

ParseStatus = Literal["ok", "format_error", "unknown_tool", "unclear", "no_answer_tags", "error"]


class Plan(TypedDict):
    """The planner's current decision, which the executor carries out."""

    turn: int
    justification: str
    context: str
    sub_goal: str
    tool: str


class StepRecord(TypedDict):
    """One planner turn as the other agents see it in memory."""

    turn: int
    """1-based planner turn that produced this record."""
    kind: Literal["action", "format_error", "verification"]
    """`action` (a tool was run), `format_error` (the planner's output did not parse), or
    `verification` (the verifier's analysis and verdict)."""
    sub_goal: NotRequired[str]
    tool: NotRequired[str | None]
    context: NotRequired[str]
    arguments: NotRequired[dict[str, Any] | None]
    result: NotRequired[str | None]
    error: NotRequired[str | None]
    seconds: NotRequired[float]
    analysis: NotRequired[str]
    verdict: NotRequired[Literal["STOP", "CONTINUE"]]


class Transition(TypedDict):
    """One model call made by a node, with what went in and what came out.

    The one record from the policy call to the stored trajectory (DESIGN.md section 6): nodes
    append it to the graph state, the trajectory store keeps it as it is (adding
    `trajectory_id` and `group_id`), and Flow-GRPO turns it into rows. Planner transitions from
    a token-faithful policy also carry `prompt_ids`, `completion_ids`, `logprobs` (one per
    completion token), `policy_version` and `sampling`; the trainer uses them as they are and
    never re-tokenises text.
    """

    node: str
    turn: int
    messages: list[dict[str, str]]
    output: str
    parse_status: ParseStatus
    seconds: float
    prompt_ids: NotRequired[list[int] | None]
    completion_ids: NotRequired[list[int] | None]
    logprobs: NotRequired[list[float] | None]
    policy_version: NotRequired[str | None]
    sampling: NotRequired[dict[str, Any]]
    """The call's `Sampling` (`temperature`, `top_p`, `max_new_tokens`, `seed`). A server policy
    adds `logprobs_mode`: `processed` (after temperature and top-p) or `raw` (before both);
    without it the logprobs are of the tempered full distribution, the one training scores."""
    notes: NotRequired[list[str]]
    """What the backend changed on the way, e.g. a prompt cut to fit the model's window."""
    trajectory_id: NotRequired[str]
    """The rollout this call belongs to; set when the trajectory is stored."""
    group_id: NotRequired[str]
    """The question's group (the G rollouts of one question); set when stored."""
