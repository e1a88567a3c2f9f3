"""The four agents as node factories, their prompts, parsers, policy protocol and tools."""

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
