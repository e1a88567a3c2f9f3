"""Routers of the AgentFlow loop, public so users can rewire their own graphs."""

from __future__ import annotations

from typing import Literal

from flowlearn.nodes.schema.state import State


def route_after_planner(state: State) -> Literal["executor", "planner", "generator"]:
    """Send a parsed turn to the executor, a format error back to the planner, a spent budget on.

    A turn whose output did not parse still counted as a turn; the planner checks the budget
    again before its next turn.
    """
    if state.get("termination"):
        return "generator"
    if state.get("plan") is None:
        return "planner"
    return "executor"


def route_after_verifier(state: State) -> Literal["planner", "generator"]:
    """Stop on the verifier's STOP, otherwise plan the next turn (which checks the budget)."""
    if state.get("verdict") == "STOP" or state.get("termination"):
        return "generator"
    return "planner"
