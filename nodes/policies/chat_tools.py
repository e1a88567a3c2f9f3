"""The JSON tool-call convention of the local chat model: instructions, parsing and salvage."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

TOOL_CALL_INSTRUCTIONS = """\
You can call these tools:
{tools}
To call a tool, reply with only a JSON object: {{"name": "<tool name>", "arguments": {{...}}}}"""


def parse_tool_calls(
    text: str, tools: Sequence[dict[str, Any]], tool_choice: str | None
) -> list[dict[str, Any]]:
    """Read `{"name", "arguments"}` JSON objects out of a reply; never raises.

    With a forced `tool_choice`, a bare JSON object is taken as that tool's arguments.
    """
    decoder = json.JSONDecoder()
    names = {t["function"]["name"] for t in tools}
    calls: list[dict[str, Any]] = []
    index = 0
    while (start := text.find("{", index)) != -1:
        try:
            value, index = decoder.raw_decode(text, start)
        except ValueError:
            value, index = _close_json(text[start:]), start + 1
            if value is None:
                continue
        if not isinstance(value, dict):
            continue
        name, args = value.get("name"), value.get("arguments", value.get("args"))
        if isinstance(name, str) and name in names and isinstance(args, dict):
            calls.append({"name": name, "args": args, "id": f"call_{len(calls)}"})
        elif tool_choice in names and not calls:
            calls.append({"name": tool_choice, "args": value, "id": "call_0"})
    return calls


def _close_json(fragment: str) -> Any:
    """Parse a JSON object a model left unclosed (ran out of tokens, or stopped early)."""
    decoder = json.JSONDecoder()
    for closing in ("}", "}}", '"}', '"}}'):
        try:
            return decoder.raw_decode(fragment.rstrip().rstrip(",") + closing)[0]
        except ValueError:
            continue
    return None


def call_prefix(function: dict[str, Any]) -> str:
    """Open a call's JSON up to its first argument's value."""
    head = '{"name": ' + json.dumps(function["name"]) + ', "arguments": {'
    params = function.get("parameters", {})
    props: dict[str, Any] = params.get("properties", {})
    first = next(iter(params.get("required") or props), None)
    if first is None:
        return head
    quote = '"' if props.get(first, {}).get("type") == "string" else ""
    return f"{head}{json.dumps(first)}: {quote}"


def salvage_forced_call(prefill: str, completion: str) -> list[dict[str, Any]]:
    """Read a forced call whose JSON never closed: the first string argument runs to its quote.

    This is what constrained decoding would have produced; without it a small model's stray
    quote would cost the whole call.
    """
    if not prefill.endswith('"'):
        return []
    opened = json.loads(prefill + '"}}')  # the prefill with an empty first value
    (first,) = opened["arguments"]
    raw = re.split(r'(?<!\\)"', completion, maxsplit=1)[0]
    try:
        value = json.loads(f'"{raw}"')
    except ValueError:
        value = raw
    return [{"name": opened["name"], "args": {first: value}, "id": "call_0"}]
