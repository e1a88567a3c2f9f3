"""The AgentFlow graph: shared-memory state, run context, routers and the builder."""

from flowlearn.graphs.agentflow import as_policy, build_agentflow
from flowlearn.graphs.context import Context
from flowlearn.graphs.embedding import as_tool, subgraph_node
from flowlearn.graphs.routing import route_after_planner, route_after_verifier
from flowlearn.graphs.state import InputState, State, Termination

__all__ = [
    "Context",
    "InputState",
    "State",
    "Termination",
    "as_policy",
    "as_tool",
    "build_agentflow",
    "route_after_planner",
    "route_after_verifier",
    "subgraph_node",
]
