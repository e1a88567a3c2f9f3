"""The human review of a tool call (`Context.approve_tools`): LangGraph `interrupt`, checked.

The executor pauses before running a proposed call; a resume value approves it, rejects it, or
edits its arguments, and an edit is checked against the tool's schema before anything runs.
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.tools import BaseTool
from langgraph.types import interrupt
from pydantic import BaseModel, ValidationError, create_model

from flowlearn.nodes.catalogue import tool_arguments

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
