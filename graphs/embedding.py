"""Embed a compiled flow in other LangGraph graphs and LangChain agents."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool


def subgraph_node(
    graph: Any,
    *,
    question_key: str = "question",
    answer_key: str = "answer",
    extra_keys: dict[str, str] | None = None,
) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """Return a node for a parent graph whose state differs from the flow's.

    The node reads the question from `state[question_key]`, runs the flow, and writes its
    answer to `answer_key`; `extra_keys` maps more flow outputs to parent keys, e.g.
    `{"memory": "agent_memory", "transitions": "agent_transitions"}`. LangGraph passes the
    parent's config on, so streaming and checkpointing reach into the flow.
    """
    mapping = {"answer": answer_key, **(extra_keys or {})}

    def run_flow(state: dict[str, Any]) -> dict[str, Any]:
        result = graph.invoke({"question": state[question_key]})
        return {parent: result.get(child) for child, parent in mapping.items()}

    return run_flow


def as_tool(
    graph: Any,
    *,
    name: str = "agentflow",
    description: str = "Answer a hard question by planning and using tools step by step.",
    context: Any = None,
) -> BaseTool:
    """Wrap the flow as a LangChain tool taking a question and returning the answer."""

    def agentflow(question: str) -> str:
        return str(graph.invoke({"question": question}, context=context).get("answer", ""))

    async def aagentflow(question: str) -> str:
        state = await graph.ainvoke({"question": question}, context=context)
        return str(state.get("answer", ""))

    return StructuredTool.from_function(
        agentflow, coroutine=aagentflow, name=name, description=description
    )
