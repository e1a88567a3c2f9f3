"""Fakes shared by the tests: the scripted backends of `flowlearn.engine.scripted`."""

from __future__ import annotations

from flowlearn.engine.scripted import ScriptedChatModel, ScriptedPolicy, planner_turn

FakeChatModel = ScriptedChatModel
plan = planner_turn

__all__ = ["FakeChatModel", "ScriptedPolicy", "plan"]
