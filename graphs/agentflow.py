"""Build the AgentFlow graph: planner -> executor -> verifier -> (planner | generator)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy

from flowlearn.engine.chat import ChatModelPolicy
from flowlearn.engine.protocol import Policy
from flowlearn.graphs.routing import route_after_planner, route_after_verifier
from flowlearn.nodes.executor import make_executor
from flowlearn.nodes.generator import make_generator
from flowlearn.nodes.planner import make_planner
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts
from flowlearn.nodes.retry import ENGINE_RETRY
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.state import InputState, State
from flowlearn.nodes.verifier import make_verifier

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.tools import BaseTool
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.graph.state import CompiledStateGraph


def as_policy(planner: Policy | BaseChatModel) -> Policy:
    """Return `planner` as a Policy, wrapping a plain chat model for inference-only use."""
    from langchain_core.language_models import BaseChatModel

    # Checked first: a chat model also has a `generate` method, so it passes the Policy check.
    if isinstance(planner, BaseChatModel):
        return ChatModelPolicy(planner)
    if isinstance(planner, Policy):
        return planner
    raise TypeError(
        f"planner must be a Policy (e.g. HFPolicy) or a LangChain BaseChatModel, "
        f"got {type(planner).__name__}"
    )


TRAINABLE_NODES = ("planner", "verifier", "executor")
"""The AgentFlow graph's nodes that can call a trained policy of their own (the generator and
the query analysis run the fixed engine)."""


def build_agentflow(
    planner_policy: Policy | BaseChatModel,
    engine: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    prompts: Prompts = AGENTFLOW_PROMPTS,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    name: str = "agentflow",
    retry_policy: RetryPolicy | None = ENGINE_RETRY,
    output_schema: type[Any] = State,
    verifier_policy: Policy | None = None,
    executor_policy: Policy | None = None,
) -> CompiledStateGraph[State, Context, InputState, Any]:
    """Compile the four-agent AgentFlow graph.

    Args:
        planner_policy: The trainable planner; a plain chat model plans for inference only.
        engine: The fixed chat model of the executor, verifier, generator and query analysis.
        tools: LangChain tools the planner may choose from.
        prompts: What every node says to its model: templates, worked examples and budgets
            (AgentFlow's by default; `flowlearn.nodes.smollm2.SMOLLM2_PROMPTS` for the
            embedded 135M model, or your own via `dataclasses.replace`).
        checkpointer: Optional checkpointer (e.g. `SqliteSaver`) for durable, resumable runs.
        name: The compiled graph's name.
        retry_policy: How each node retries its transient model errors (None: never); bound
            into the nodes when they are built, so hand-composed graphs get the same. Once its
            attempts are spent, and for any other engine error, the error is recorded in
            memory and transitions, and the run goes on.
        output_schema: What `invoke` and API clients get: the whole `State` (default;
            training reads its transitions), or `OutputState` (question, answer, termination,
            turns, memory; no token ids), as the LangGraph server's graph uses.
        verifier_policy: A trained verifier (its own adapter, `engine.adapters.AdapterPolicy`):
            its calls go through this policy and record their tokens; None: the engine judges.
        executor_policy: A trained executor (its own adapter): it writes each tool call
            through this policy, recording its tokens; None: the engine writes them.

    Raises:
        ValueError: no tools, or two tools with the same name.

    """
    tools = list(tools)
    if not tools:
        raise ValueError("build_agentflow needs at least one tool; pass e.g. default_tools()")
    names = [tool.name for tool in tools]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise ValueError(f"tool names must be unique; {duplicated} appear more than once")

    graph = StateGraph(
        State, context_schema=Context, input_schema=InputState, output_schema=output_schema
    )
    retry = retry_policy
    planner = make_planner(
        as_policy(planner_policy), tools, analysis_engine=engine, prompts=prompts, retry=retry
    )
    graph.add_node("planner", planner)
    executor = make_executor(engine, tools, prompts=prompts, retry=retry, policy=executor_policy)
    graph.add_node("executor", executor)
    verifier = make_verifier(engine, tools, prompts=prompts, retry=retry, policy=verifier_policy)
    graph.add_node("verifier", verifier)
    graph.add_node("generator", make_generator(engine, prompts=prompts, retry=retry))
    graph.add_edge(START, "planner")
    graph.add_conditional_edges("planner", route_after_planner)
    graph.add_edge("executor", "verifier")
    graph.add_conditional_edges("verifier", route_after_verifier)
    graph.add_edge("generator", END)
    return graph.compile(checkpointer=checkpointer, name=name)
