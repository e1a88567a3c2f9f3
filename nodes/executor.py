"""The executor: the fixed engine fills in the tool's arguments, then the tool runs."""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool
from langgraph.types import RetryPolicy, interrupt
from pydantic import BaseModel, ValidationError, create_model

from flowlearn.nodes.catalogue import describe_tool, tool_arguments
from flowlearn.nodes.messages import to_langchain
from flowlearn.nodes.prompts import (
    EXECUTOR_JSON_FALLBACK_PROMPT,
    EXECUTOR_MAX_TOKENS,
    EXECUTOR_PROMPT,
)
from flowlearn.nodes.render import (
    emit,
    prompt_messages,
    summarize,
    transition,
    truncate,
)
from flowlearn.nodes.retry import ENGINE_RETRY, engine_error, retrying
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import ParseStatus, StepRecord
from flowlearn.nodes.schema.state import State
from flowlearn.nodes.secrets import error_text

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.runtime import Runtime

_JSON_DECODER = json.JSONDecoder()


def _first_json_object(text: str) -> dict[str, Any] | None:
    """Return the first JSON object embedded in `text`, or None."""
    for start, char in enumerate(text):
        if char != "{":
            continue
        try:
            value, _ = _JSON_DECODER.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _single_argument_fallback(tool: BaseTool, text: str) -> dict[str, Any] | None:
    """Use the model's plain text as the argument of a tool that takes one string."""
    args = tool.args
    if len(args) == 1:
        ((name, spec),) = args.items()
        if spec.get("type", "string") == "string" and text.strip():
            return {name: text.strip()}
    return None


def call_with_timeout(tool: BaseTool, arguments: dict[str, Any], seconds: float) -> Any:
    """Run the tool on a worker thread; stop waiting after `seconds` with a `TimeoutError`.

    A hung tool's thread cannot be killed from Python; it is left behind (as a daemon) while
    the flow records the timeout and moves on.
    """
    done: Future[Any] = Future()

    def work() -> None:
        try:
            done.set_result(tool.invoke(arguments))
        except BaseException as exc:
            done.set_exception(exc)

    context = contextvars.copy_context()  # the tool still sees LangGraph's run config
    threading.Thread(
        target=context.run, args=(work,), name=f"tool-{tool.name}", daemon=True
    ).start()
    try:
        return done.result(timeout=seconds)
    except FutureTimeout:
        raise TimeoutError(
            f"{tool.name} did not finish within {seconds:g} s (Context.tool_timeout_s)"
        ) from None


def propose_arguments(
    engine: BaseChatModel, tool: BaseTool, messages: list[dict[str, str]]
) -> tuple[dict[str, Any] | None, str, ParseStatus]:
    """Ask the engine for the tool's arguments, by tool calling when it can, else by JSON.

    Returns the arguments (None when none could be read), the raw output and a parse status.
    Generated text is only ever parsed as data, never executed.
    """
    try:
        bound = engine.bind_tools([tool], tool_choice=tool.name, max_tokens=EXECUTOR_MAX_TOKENS)
    except (NotImplementedError, TypeError, ValueError):
        bound = None
    if bound is not None:
        reply = bound.invoke(to_langchain(messages))
        calls = reply.tool_calls if isinstance(reply, AIMessage) else []
        for call in calls:
            if call["name"] == tool.name:
                return dict(call["args"]), json.dumps(call, default=str), "ok"
        text = reply.text
    else:
        schema = json.dumps(tool_arguments(tool), ensure_ascii=False)
        ask = EXECUTOR_JSON_FALLBACK_PROMPT.format(tool=tool.name, schema=schema)
        fallback = [*messages, {"role": "user", "content": ask}]
        text = engine.invoke(to_langchain(fallback), max_tokens=EXECUTOR_MAX_TOKENS).text
    arguments = _first_json_object(text) or _single_argument_fallback(tool, text)
    return arguments, text, "ok" if arguments is not None else "format_error"


def run_tool(
    record: StepRecord,
    tool: BaseTool,
    arguments: dict[str, Any] | None,
    rejected: bool,
    proposal: tuple[ParseStatus, str],
    context: Context,
) -> None:
    """Run the tool on the proposed arguments and write the result or error into `record`."""
    status, raw = proposal
    start = time.perf_counter()
    if rejected:
        record["error"] = "the tool call was rejected by the reviewer"
    elif arguments is None:
        record["error"] = (
            raw
            if status == "error"
            else f"the engine gave no usable arguments for {tool.name}: {raw[:200]!r}"
        )
    else:
        try:
            result = call_with_timeout(tool, arguments, context.tool_timeout_s)
            record["result"] = truncate(_as_text(result), context.max_result_chars)
        except Exception as exc:  # a tool failure is data for the planner, not a crash
            record["error"] = truncate(error_text(exc), context.max_result_chars)  # no secrets
    record["seconds"] = round(time.perf_counter() - start, 6)


def make_executor(
    engine: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    retry: RetryPolicy | None = ENGINE_RETRY,
) -> Callable[..., dict[str, Any]]:
    """Build the executor node over the fixed engine and the bound tools.

    The engine's argument proposal is retried per `retry`; tool calls are never retried.
    """
    by_name = {tool.name: tool for tool in tools}
    propose = retrying(propose_arguments, retry)

    def executor(state: State, runtime: Runtime[Context]) -> dict[str, Any]:

        context = runtime.context or Context()
        plan = state.get("plan")
        if plan is None:
            raise ValueError(
                "executor reached without a plan; route to it only after a parsed turn"
            )
        tool = by_name[plan["tool"]]
        messages = prompt_messages(
            EXECUTOR_PROMPT.format(
                tool=tool.name,
                question=state["question"],
                context=plan["context"],
                sub_goal=plan["sub_goal"],
                tool_description=describe_tool(tool),
            )
        )
        start = time.perf_counter()
        try:
            arguments, raw, status = propose(engine, tool, messages)
        except Exception as exc:  # retries spent, or not worth one: recorded, the run goes on
            arguments, status, raw = None, "error", engine_error(exc)
        call_seconds = time.perf_counter() - start
        record: StepRecord = {
            "turn": plan["turn"],
            "kind": "action",
            "sub_goal": plan["sub_goal"],
            "context": plan["context"],
            "tool": tool.name,
            "arguments": arguments,
            "result": None,
            "error": None,
        }
        rejected = False
        if arguments is not None and context.approve_tools:
            reviewed = review(plan["turn"], tool, plan["sub_goal"], arguments)
            rejected = reviewed is None
            record["arguments"] = arguments = arguments if reviewed is None else reviewed
        run_tool(record, tool, arguments, rejected, (status, raw), context)
        emit(
            runtime,
            {
                "event": "tool",
                "turn": plan["turn"],
                "tool": tool.name,
                "arguments": arguments,
                "ok": record["error"] is None,
                "summary": summarize(record["error"] or record["result"] or ""),
            },
        )
        return {
            "memory": [record],
            "transitions": [
                transition("executor", plan["turn"], messages, raw, status, call_seconds)
            ],
        }

    return executor


RESUME_FORMS = (
    'True or {"approve": true} to run the call, False or {"approve": false} to reject it, or '
    '{"arguments": {...}} to run it with arguments that fit the interrupt\'s "schema"'
)
_JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list}


def review(
    turn: int, tool: BaseTool, sub_goal: str, arguments: dict[str, Any]
) -> dict[str, Any] | None:
    """Pause the run for a human decision on a tool call (LangGraph `interrupt`).

    Returns the arguments to run with (as proposed or as edited), or None for a rejected call.
    A value none of `RESUME_FORMS`, or an edit that breaks the tool's schema, pauses again with
    an `error` naming the problem (LangGraph's way to validate human input): it never runs.
    """
    request = dict(turn=turn, tool=tool.name, sub_goal=sub_goal, arguments=arguments)
    request.update(schema=tool_arguments(tool), resume_with=RESUME_FORMS)
    while (problem := resume_problem(decision := interrupt(request), tool)) is not None:
        request = {**request, "error": problem}
    edit = decision if isinstance(decision, dict) else {"approve": decision}
    if "arguments" in edit:
        return dict(edit["arguments"])
    return arguments if edit["approve"] else None


def resume_problem(decision: object, tool: BaseTool) -> str | None:
    """Say what is wrong with an `approve_tools` resume value; None when it is accepted."""
    edit = decision if isinstance(decision, dict) else {}
    approve = edit["approve"] if edit.keys() == {"approve"} else None
    if isinstance(decision, bool) or isinstance(approve, bool):
        return None
    if edit.keys() != {"arguments"} or not isinstance(edit["arguments"], dict):
        return f"unrecognised resume value {decision!r:.200}. Resume with {RESUME_FORMS}"
    problems = argument_problems(tool, edit["arguments"])
    why = f"the edited arguments do not fit {tool.name}'s schema: {'; '.join(problems)}"
    return f"{why}. Resume with {RESUME_FORMS}" if problems else None


def argument_problems(tool: BaseTool, arguments: dict[str, Any]) -> list[str]:
    """List how `arguments` break the tool's schema: unknown, missing, mistyped (strictly) keys."""
    known = tool.args
    problems = [f"unknown key {key!r}" for key in sorted(set(arguments) - set(known))]
    schema: Any = tool.tool_call_schema
    if not isinstance(schema, dict) and not issubclass(schema, BaseModel):  # a pydantic.v1 model
        schema = schema.schema()
    if isinstance(schema, dict):  # a plain JSON schema (MCP tools, say): its top level, checked
        required = set(schema.get("required", ()))
        fields: dict[str, Any] = {
            key: (_JSON_TYPES.get(str(spec.get("type")), Any), ... if key in required else None)
            for key, spec in known.items()
        }
        schema = create_model("Arguments", **fields)
    given = {key: value for key, value in arguments.items() if key in known}
    try:
        schema.model_validate_json(json.dumps(given, default=str), strict=True)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            got = "" if error["type"] == "missing" else f", got {error['input']!r:.80}"
            problems.append(f"{'.'.join(map(str, error['loc']))!r}: {error['msg']}{got}")
    return problems


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    content = getattr(result, "content", None)  # a ToolMessage
    if isinstance(content, str):
        return content
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)
