"""flowlearn: agent workflows that learn from their own runs (AgentFlow, Flow-GRPO, LangGraph)."""

from flowlearn.graphs import (
    Context,
    InputState,
    State,
    build_agentflow,
    route_after_planner,
    route_after_verifier,
)
from flowlearn.nodes import (
    ChatModelPolicy,
    Generation,
    Policy,
    Sampling,
    ServerChatModel,
    ServerPolicy,
    make_executor,
    make_generator,
    make_planner,
    make_verifier,
)

__version__ = "0.1.0"

__all__ = [
    "ChatModelPolicy",
    "Context",
    "Generation",
    "InputState",
    "Policy",
    "Sampling",
    "ServerChatModel",
    "ServerPolicy",
    "State",
    "__version__",
    "build_agentflow",
    "make_executor",
    "make_generator",
    "make_planner",
    "make_verifier",
    "route_after_planner",
    "route_after_verifier",
]
