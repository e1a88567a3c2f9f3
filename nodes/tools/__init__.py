"""Built-in LangChain tools, and the default set for the main job."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool

from flowlearn.nodes.tools.generalist import generalist_tool
from flowlearn.nodes.tools.python_sandbox import python_coder_tool, python_tool, run_python


def default_tools(engine: Any, *, python_timeout: float = 10.0) -> list[BaseTool]:
    """Return the offline default tools: `python` and `generalist` over the fixed engine."""
    return [python_tool(timeout=python_timeout), generalist_tool(engine)]


__all__ = [
    "default_tools",
    "generalist_tool",
    "python_coder_tool",
    "python_tool",
    "run_python",
]
