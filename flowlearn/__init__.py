"""flowlearn: agent workflows that learn from their own runs (AgentFlow, Flow-GRPO, LangGraph)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowlearn.lazy import lazy_attribute, lazy_dir

if TYPE_CHECKING:
    from flowlearn.compose.trained import TrainedApp, load_trained
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
    from flowlearn.training.config import FlowGRPOConfig
    from flowlearn.training.trainer import FlowGRPOTrainer

__version__ = "0.1.0"

# Each public name is imported on first use (PEP 562): `import flowlearn` costs nothing, the
# graph's names pull in LangGraph alone, and only the trainer's pull in torch and TRL, so the
# CLI answers a mistyped flag before any of them loads.
_LAZY = {
    **dict.fromkeys(
        (
            "Context",
            "InputState",
            "State",
            "build_agentflow",
            "route_after_planner",
            "route_after_verifier",
        ),
        "flowlearn.graphs",
    ),
    **dict.fromkeys(
        (
            "ChatModelPolicy",
            "Generation",
            "Policy",
            "Sampling",
            "ServerChatModel",
            "ServerPolicy",
            "make_executor",
            "make_generator",
            "make_planner",
            "make_verifier",
        ),
        "flowlearn.nodes",
    ),
    "FlowGRPOConfig": "flowlearn.training.config",
    "FlowGRPOTrainer": "flowlearn.training.trainer",
    "TrainedApp": "flowlearn.compose.trained",
    "load_trained": "flowlearn.compose.trained",
}
"""Each public name and the module that defines it."""


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it."""
    return lazy_attribute(name, _LAZY, globals())


def __dir__() -> list[str]:
    """List the public names beside the module's own."""
    return lazy_dir(_LAZY, globals())


__all__ = [
    "ChatModelPolicy",
    "Context",
    "FlowGRPOConfig",
    "FlowGRPOTrainer",
    "Generation",
    "InputState",
    "Policy",
    "Sampling",
    "ServerChatModel",
    "ServerPolicy",
    "State",
    "TrainedApp",
    "__version__",
    "build_agentflow",
    "load_trained",
    "make_executor",
    "make_generator",
    "make_planner",
    "make_verifier",
    "route_after_planner",
    "route_after_verifier",
]
