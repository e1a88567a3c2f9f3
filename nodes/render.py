"""Render shared memory into prompt text, and build prompt messages and transitions."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from flowlearn.engine.sampling import Generation, calls_until
from flowlearn.nodes.prompts import ANSWER_INSTRUCTION, EMPTY_MEMORY, SYSTEM_PROMPT, MemoryView
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import ParseStatus, StepRecord, Transition
from flowlearn.nodes.schema.state import State


def _under(value: Any) -> str:
    """Indent every continuation line of a field value under its field.

    Only the renderer writes at column 0, so a tool result holding a line "Step 2 verification:
    STOP" cannot pass for a memory line. `splitlines` also breaks on carriage returns and Unicode
    line separators, which a model may read as line ends.
    """
    return "\n    ".join(str(value).splitlines())


def bare_question(question: str) -> str:
    """Return the question without its trailing answer instruction (`MemoryView.bare_question`)."""
    return question.replace(ANSWER_INSTRUCTION, "").rstrip()


def render_memory(
    memory: Sequence[StepRecord], *, arguments: bool = True, sub_goals: bool = True
) -> str:
    """Render step records as numbered lines the agents can read.

    `arguments=False` leaves each action's tool arguments out, `sub_goals=False` its sub-goal
    (the generator's view).
    """
    if not memory:
        return EMPTY_MEMORY
    lines = []
    for record in memory:
        kind = record["kind"]
        head = f"Step {record['turn']}"
        if kind == "action":
            outcome = (
                f"Error: {record.get('error')}" if record.get("error") else record.get("result")
            )
            shown = f"  Sub-Goal: {_under(record.get('sub_goal', ''))}\n" if sub_goals else ""
            if arguments:
                called = json.dumps(record.get("arguments"), ensure_ascii=False, default=str)
                shown += f"  Arguments: {_under(called)}\n"
            lines.append(
                f"{head} (tool {_under(record.get('tool'))}):\n{shown}  Result: {_under(outcome)}"
            )
        elif kind == "format_error":
            error = _under(record.get("error"))
            lines.append(f"{head}: the planner's output could not be used ({error}).")
        else:
            lines.append(f"{head} verification: {_under(record.get('verdict'))}")
    return "\n".join(lines)


def memory_prompt(
    template: str,
    state: Mapping[str, Any],
    examples: Sequence[tuple[str, Sequence[StepRecord], str]] = (),
    *,
    view: MemoryView | None = None,
    system: str = SYSTEM_PROMPT,
    tools: str = "",
) -> list[dict[str, str]]:
    """Render a template over the question, analysis, memory and tools (verifier, generator).

    Each of `examples` (a question, its memory and the reply wanted) comes first as an earlier
    user and assistant turn, rendered by the same template. `view` says what of the memory and
    question is shown; the analysis is left empty when `view.analysis` is off.
    """
    view = view or MemoryView()
    question = str(state["question"])
    memory = state.get("memory", [])
    messages = prompt_messages(
        template.format(
            question=bare_question(question) if view.bare_question else question,
            analysis=state.get("analysis", "") if view.analysis else "",
            memory=render_memory(memory, arguments=view.arguments, sub_goals=view.sub_goals),
            tools=tools,
        ),
        system=system,
    )
    shown = []
    for example_question, example_memory, reply in examples:
        rendered = render_memory(example_memory, arguments=view.arguments, sub_goals=view.sub_goals)
        user = template.format(question=example_question, analysis="", memory=rendered, tools=tools)
        shown += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    return [messages[0], *shown, *messages[1:]]


def prompt_messages(user: str, *, system: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """Return the system and user messages of a prompt."""
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def transition(
    node: str,
    turn: int,
    messages: list[dict[str, str]],
    output: str,
    parse_status: ParseStatus,
    seconds: float,
    **policy_fields: Any,
) -> Transition:
    """Build a transition record; `policy_fields` adds token ids and logprobs where known."""
    record: Transition = {
        "node": node,
        "turn": turn,
        "messages": messages,
        "output": output,
        "parse_status": parse_status,
        "seconds": round(seconds, 6),
    }
    record.update(policy_fields)  # type: ignore[typeddict-item]
    return record


def policy_transition(
    node: str,
    turn: int,
    messages: list[dict[str, str]],
    generation: Generation,
    parse_status: ParseStatus = "ok",
) -> Transition:
    """Build the transition of one policy call, with its exact token ids and logprobs.

    Custom nodes append this to the `transitions` state key; training turns every such record
    into Flow-GRPO rows, whatever node wrote it.
    """
    return transition(
        node,
        turn,
        messages,
        generation.text,
        parse_status,
        generation.seconds,
        prompt_ids=generation.prompt_ids,
        completion_ids=generation.completion_ids,
        logprobs=generation.logprobs,
        policy_version=generation.policy_version,
        sampling=generation.sampling,
        **({"notes": list(generation.notes)} if generation.notes else {}),
    )


def emit(runtime: Any, event: dict[str, Any]) -> None:
    """Send a custom stream event (`stream_mode="custom"`, Studio) if a writer is attached.

    Uses the runtime's writer, the same one `get_stream_writer()` returns inside a run; a node
    called on its own (no runtime) simply emits nothing.
    """
    writer = getattr(runtime, "stream_writer", None)
    if writer is not None:
        writer(event)


def summarize(text: str, limit: int = 200) -> str:
    """Flatten whitespace and cut `text` to `limit` characters for an event or a log line."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def truncate(text: str, limit: int, *, length: int | None = None) -> str:
    """Cut `text` to `limit` characters with a visible marker saying how much was dropped.

    `length` is the whole text's length where `text` is already a cut of it.
    """
    length = len(text) if length is None else length
    if length <= limit:
        return text
    return f"{text[:limit]}\n[... truncated {length - limit} characters]"


def run_deadline(state: State, context: Context) -> float | None:
    """Return when the run's `max_seconds` budget ends (a `time.time()` value), or None.

    Every model call a node makes carries it (`within_run_budget`; the planner's policy calls
    as `Sampling.deadline`), so a served model gives up on a silent or slow server when the
    run's time is up instead of holding the run past it.
    """
    started = state.get("started_at")
    if context.max_seconds is None or started is None:
        return None
    return float(started) + context.max_seconds


Node = Callable[[State, Any], dict[str, Any]]


def within_run_budget(node: Node) -> Node:
    """Wrap a node so that every model call it makes ends by the run's deadline.

    The deadline (`run_deadline`) becomes the calls' `engine.sampling.CALL_DEADLINE`, which a
    served model (`ServerPolicy`, under `ServerChatModel` too) honours; local models ignore it.
    The planner, where a run's clock starts, sets its own (`make_planner`). The wrapper keeps
    the node's signature, so LangGraph still hands it the runtime.
    """

    @functools.wraps(node)
    def bounded(state: State, runtime: Any) -> dict[str, Any]:
        context = getattr(runtime, "context", None) or Context()
        with calls_until(run_deadline(state, context)):
            return node(state, runtime)

    return bounded
