"""The four agents as node factories, their prompts, parsers, policy protocol and tools.

Each name imports its module on first use (PEP 562): the schema and prompts (`nodes.schema`,
`nodes.presets`) stay free of LangGraph and LangChain, so the CLI builds its options from them
and answers a mistyped flag before either loads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowlearn.lazy import lazy_attribute, lazy_dir

if TYPE_CHECKING:
    from flowlearn.engine.chat import ChatModelPolicy, ServerChatModel
    from flowlearn.engine.protocol import Policy
    from flowlearn.engine.server import ServerPolicy
    from flowlearn.nodes.catalogue import describe_tool, render_catalogue
    from flowlearn.nodes.executor import make_executor
    from flowlearn.nodes.generator import make_generator
    from flowlearn.nodes.parsing import (
        PlannerDecision,
        extract_answer,
        match_tool_name,
        parse_planner_output,
        parse_verdict,
    )
    from flowlearn.nodes.planner import make_planner
    from flowlearn.nodes.render import policy_transition
    from flowlearn.nodes.schema import (
        Context,
        Generation,
        InputState,
        Plan,
        Sampling,
        State,
        StepRecord,
        Transition,
        token_faithful,
    )
    from flowlearn.nodes.verifier import make_verifier

_LAZY = {
    **dict.fromkeys(("ChatModelPolicy", "ServerChatModel"), "flowlearn.engine.chat"),
    "Policy": "flowlearn.engine.protocol",
    "ServerPolicy": "flowlearn.engine.server",
    **dict.fromkeys(("describe_tool", "render_catalogue"), "flowlearn.nodes.catalogue"),
    "make_executor": "flowlearn.nodes.executor",
    "make_generator": "flowlearn.nodes.generator",
    **dict.fromkeys(
        (
            "PlannerDecision",
            "extract_answer",
            "match_tool_name",
            "parse_planner_output",
            "parse_verdict",
        ),
        "flowlearn.nodes.parsing",
    ),
    "make_planner": "flowlearn.nodes.planner",
    "policy_transition": "flowlearn.nodes.render",
    **dict.fromkeys(
        (
            "Context",
            "Generation",
            "InputState",
            "Plan",
            "Sampling",
            "State",
            "StepRecord",
            "Transition",
            "token_faithful",
        ),
        "flowlearn.nodes.schema",
    ),
    "make_verifier": "flowlearn.nodes.verifier",
}
"""Each public name and the module that defines it, imported on first use."""


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it."""
    return lazy_attribute(name, _LAZY, globals())


def __dir__() -> list[str]:
    """List the public names beside the module's own."""
    return lazy_dir(_LAZY, globals())


__all__ = [
    "ChatModelPolicy",
    "Context",
    "Generation",
    "InputState",
    "Plan",
    "PlannerDecision",
    "Policy",
    "Sampling",
    "ServerChatModel",
    "ServerPolicy",
    "State",
    "StepRecord",
    "Transition",
    "describe_tool",
    "extract_answer",
    "make_executor",
    "make_generator",
    "make_planner",
    "make_verifier",
    "match_tool_name",
    "parse_planner_output",
    "parse_verdict",
    "policy_transition",
    "render_catalogue",
    "token_faithful",
]
