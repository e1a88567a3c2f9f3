"""Render the tool catalogue the planner reads, from each tool's own metadata."""

from __future__ import annotations

import json
from collections.abc import Sequence

from langchain_core.tools import BaseTool


def tool_arguments(tool: BaseTool) -> dict[str, object]:
    """Return the JSON schema of a tool's arguments, as the model would fill them."""
    return {name: dict(spec) for name, spec in tool.args.items()}


def describe_tool(tool: BaseTool) -> str:
    """Render one tool: name, description, argument schema and usage notes.

    Usage notes come from `tool.metadata["usage_notes"]` when the tool author sets them, so a
    user's own `@tool` needs nothing extra to appear in the planner's prompt.
    """
    lines = [f"- {tool.name}: {(tool.description or '').strip()}"]
    args = tool_arguments(tool)
    if args:
        lines.append(f"  Arguments: {json.dumps(args, ensure_ascii=False, sort_keys=True)}")
    notes = (tool.metadata or {}).get("usage_notes")
    if notes:
        lines.append(f"  Usage notes: {str(notes).strip()}")
    return "\n".join(lines)


def render_catalogue(tools: Sequence[BaseTool], *, brief: bool = False) -> str:
    """Render the catalogue of `tools` for a prompt, one entry per tool.

    `brief` renders each tool's name and description only, for the query analysis: what the
    tools are for, without the argument schemas and usage notes the planner and executor need
    (`Prompts.brief_analysis_catalogue`).
    """
    if not tools:
        return "(no tools available)"
    if brief:
        return "\n".join(f"- {tool.name}: {(tool.description or '').strip()}" for tool in tools)
    return "\n".join(describe_tool(tool) for tool in tools)


def enabled_tools(tools: Sequence[BaseTool], names: Sequence[str] | None) -> list[BaseTool]:
    """Return the bound tools that `names` enables (all of them when `names` is None).

    Raises:
        ValueError: a name that is not among the bound tools.

    """
    if names is None:
        return list(tools)
    by_name = {tool.name: tool for tool in tools}
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise ValueError(
            f"context.tools names {unknown}, which are not bound to this graph; "
            f"bound tools are {sorted(by_name)}"
        )
    return [by_name[name] for name in names]
