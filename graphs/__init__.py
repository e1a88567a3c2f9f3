"""The AgentFlow graph: routers and the builder, with the schema (state, context, records).

Also what trains a LangGraph app of your own (`trainable`): a chat model that records its calls
by node, and the adapter from your graph to the trainer's rollouts.
"""

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
