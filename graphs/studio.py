"""The graph `langgraph dev` (Studio) and LangGraph servers load: models built from the environment.

`langgraph.json` points at `flowlearn.graphs.studio:make_graph`. The models load on the first
run, once per process, from `$FLOWLEARN_PLANNER` / `$FLOWLEARN_ENGINE` (default: the embedded
SmolLM2), with tools from `$FLOWLEARN_CORPUS` and `$FLOWLEARN_WEB_TOOLS`. The graph is compiled
without a checkpointer: the server brings its own.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def build_graph_from_env() -> Any:
    """Build the AgentFlow graph on local models named by environment variables (cached)."""
    from flowlearn.graphs.agentflow import build_agentflow
    from flowlearn.nodes.local_models import load_local_models
    from flowlearn.nodes.tools import default_tools

    models = load_local_models()
    return build_agentflow(models.planner, models.engine, default_tools(models.engine))


async def make_graph() -> Any:
    """Return the graph; loading happens in a worker thread, never on the server's event loop."""
    return await asyncio.to_thread(build_graph_from_env)
