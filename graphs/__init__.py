"""The AgentFlow graph: routers and the builder, with the schema (state, context, records).

Also what trains a LangGraph app of your own (`trainable`): a chat model that records its calls
by node, and the adapter from your graph to the trainer's rollouts. Each name imports its
module on first use (PEP 562): the schema's names do not pull in LangGraph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowlearn.lazy import lazy_attribute, lazy_dir

if TYPE_CHECKING:
    from flowlearn.graphs.agentflow import as_policy, build_agentflow
    from flowlearn.graphs.embedding import as_tool, subgraph_node
    from flowlearn.graphs.routing import route_after_planner, route_after_verifier
    from flowlearn.graphs.trainable import (
        TrainableChatModel,
        TrainableGraph,
        TransitionRecorder,
        trainable_graph,
    )
    from flowlearn.nodes.schema import (
        Context,
        Generation,
        InputState,
        OutputState,
        Plan,
        Sampling,
        State,
        StepRecord,
        Termination,
        Transition,
    )

_LAZY = {
    **dict.fromkeys(("as_policy", "build_agentflow"), "flowlearn.graphs.agentflow"),
    **dict.fromkeys(("as_tool", "subgraph_node"), "flowlearn.graphs.embedding"),
    **dict.fromkeys(("route_after_planner", "route_after_verifier"), "flowlearn.graphs.routing"),
    **dict.fromkeys(
        ("TrainableChatModel", "TrainableGraph", "TransitionRecorder", "trainable_graph"),
        "flowlearn.graphs.trainable",
    ),
    **dict.fromkeys(
        (
            "Context",
            "Generation",
            "InputState",
            "OutputState",
            "Plan",
            "Sampling",
            "State",
            "StepRecord",
            "Termination",
            "Transition",
        ),
        "flowlearn.nodes.schema",
    ),
}
"""Each public name and the module that defines it, imported on first use."""


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it."""
    return lazy_attribute(name, _LAZY, globals())


def __dir__() -> list[str]:
    """List the public names beside the module's own."""
    return lazy_dir(_LAZY, globals())


__all__ = [
    "Context",
    "Generation",
    "InputState",
    "OutputState",
    "Plan",
    "Sampling",
    "State",
    "StepRecord",
    "Termination",
    "TrainableChatModel",
    "TrainableGraph",
    "Transition",
    "TransitionRecorder",
    "as_policy",
    "as_tool",
    "build_agentflow",
    "route_after_planner",
    "route_after_verifier",
    "subgraph_node",
    "trainable_graph",
]
