"""Fakes shared by the tests: the scripted backends of `flowlearn.nodes.policies.scripted`."""

from __future__ import annotations

from flowlearn.nodes.policies.scripted import ScriptedChatModel, ScriptedPolicy, planner_turn

FakeChatModel = ScriptedChatModel
plan = planner_turn

__all__ = ["FakeChatModel", "ScriptedPolicy", "plan"]
