"""The `generalist` tool: one plain call to the fixed engine."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import BaseTool, StructuredTool

from flowlearn.engine.chat import to_langchain


def generalist_tool(engine: Any) -> BaseTool:
    """Return a tool that asks the fixed chat model a self-contained question."""

    def generalist(query: str) -> str:
        reply = engine.invoke(to_langchain([{"role": "user", "content": query}]))
        return str(reply.text)

    return StructuredTool.from_function(
        generalist,
        name="generalist",
        description="Ask a general-purpose language model a self-contained question.",
        metadata={
            "usage_notes": "Include every fact it needs in the query; it sees nothing else. "
            "Good for reasoning, summaries and common knowledge; may be wrong on exact facts."
        },
    )
