"""Built-in LangChain tools, and the default set for the main job."""

from __future__ import annotations

import os
from typing import Any

from langchain_core.tools import BaseTool

from flowlearn.nodes.tools.generalist import generalist_tool
from flowlearn.nodes.tools.local_search import local_search_tool
from flowlearn.nodes.tools.python_sandbox import python_coder_tool, python_tool, run_python


def default_tools(
    engine: Any, *, corpus: str | None = None, python_timeout: float = 10.0
) -> list[BaseTool]:
    """Return the offline default tools: `python`, `generalist` and, given a corpus, `local_search`.

    Args:
        engine: the fixed chat model the generalist calls.
        corpus: a JSONL corpus for `local_search`; defaults to `$FLOWLEARN_CORPUS` when set.
        python_timeout: wall-clock seconds allowed per `python` call.

    """
    tools = [python_tool(timeout=python_timeout), generalist_tool(engine)]
    corpus = corpus or os.environ.get("FLOWLEARN_CORPUS")
    if corpus:
        tools.append(local_search_tool(corpus))
    return tools


__all__ = [
    "default_tools",
    "generalist_tool",
    "local_search_tool",
    "python_coder_tool",
    "python_tool",
    "run_python",
]
