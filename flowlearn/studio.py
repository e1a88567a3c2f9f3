"""The graph `langgraph dev` (Studio) and LangGraph servers load: parts named by the environment.

`langgraph.json` points at `flowlearn.studio:make_graph`. The models load on the first run, once
per process, through the composition root (`flowlearn.compose`): `$FLOWLEARN_PLANNER` /
`$FLOWLEARN_ENGINE` (default: the embedded SmolLM2), tools from `$FLOWLEARN_CORPUS` and
`$FLOWLEARN_WEB_TOOLS`. The `python` tool, which runs code the model writes, is bound only when
`$FLOWLEARN_STUDIO_PYTHON=1`: the server answers HTTP, so running code is an explicit opt-in. The
server itself admits only the Studio and localhost origins (`flowlearn.studio_http`). The graph is
compiled without a checkpointer: the server brings its own. Clients get `OutputState` back
(question, answer, termination, turns, memory), never token ids; the thread's checkpointed
state keeps everything.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache

from langgraph.graph.state import CompiledStateGraph

from flowlearn.compose import FlowSpec, build_flow
from flowlearn.graphs import InputState, OutputState, State
from flowlearn.nodes.schema.context import Context

Graph = CompiledStateGraph[State, Context, InputState, OutputState]


@lru_cache(maxsize=1)
def build_graph_from_env() -> Graph:
    """Build the AgentFlow graph on the parts the environment names (cached per process)."""
    return build_flow(FlowSpec.for_studio(), output_schema=OutputState).graph


async def make_graph() -> Graph:
    """Return the graph; loading happens in a worker thread, never on the server's event loop."""
    return await asyncio.to_thread(build_graph_from_env)
