"""Built-in LangChain tools, and the default set for the main job."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import BaseTool

from flowlearn.nodes.tools.generalist import generalist_tool
from flowlearn.nodes.tools.local_search import (
    CorpusRetriever,
    corpus_documents,
    local_search_tool,
    render_passages,
)
from flowlearn.nodes.tools.python_sandbox import (
    Isolation,
    SandboxUnavailableError,
    python_coder_tool,
    python_tool,
    run_python,
)
from flowlearn.nodes.tools.web_search import web_search_tool
from flowlearn.nodes.tools.wikipedia import wikipedia_tool

BUNDLED_CORPUS = Path(__file__).parent / "data" / "world_facts.jsonl"


BASE_TOOLS = ("generalist", "python", "local_search")
"""The offline default set, in order (AgentFlow's: its generator, its coder, then search)."""
WEB_TOOLS = ("wikipedia_search", "web_search")
"""The web tools, added with `web=True`."""


def default_tools(
    engine: Any,
    *,
    corpus: str | None = None,
    web: bool = False,
    python_timeout: float = 10.0,
    python_isolation: Isolation = "bwrap",
    wikipedia_endpoint: str | None = None,
    k: int = 5,
    order: Sequence[str] = (),
    retriever: BaseRetriever | None = None,
) -> list[BaseTool]:
    """Return the default tools: `generalist`, `python`, `local_search`; web ones when asked.

    The order is the planner prompt's (catalogue, tool list and plan examples); `order` names
    tools to put first, in its order (a prompt set's `tool_order`).

    Args:
        engine: the fixed chat model the generalist calls.
        corpus: a JSONL corpus for `local_search`; defaults to the small bundled
            `world_facts.jsonl` (capitals and common facts), so the offline default set has a
            retriever. Pass your own corpus for real work.
        web: add `wikipedia_search` and `web_search` (which needs `$TAVILY_API_KEY`).
        python_timeout: wall-clock seconds allowed per `python` call.
        python_isolation: "bwrap" (the sandbox; refused where the host cannot build it) or
            "none": run model-written code unisolated, an explicit opt-in that logs a warning.
        wikipedia_endpoint: the MediaWiki API URL `wikipedia_search` calls (default: English
            Wikipedia).
        k: passages `local_search` returns.
        order: tool names to list first, in this order; the rest keep theirs.
        retriever: any LangChain `BaseRetriever` for `local_search` to search instead of a
            corpus (a community `BM25Retriever`, a vector store's `.as_retriever()`, your own);
            it keeps the first `k` Documents the retriever returns. Not with `corpus`.

    Raises:
        ValueError: both `corpus` and `retriever`.

    """
    if retriever is not None and corpus is not None:
        raise ValueError("default_tools takes a corpus or a retriever for local_search, not both")
    python = python_tool(timeout=python_timeout, isolation=python_isolation)
    if retriever is not None:
        search = local_search_tool(retriever=retriever, k=k)
    else:
        search = local_search_tool(corpus or str(BUNDLED_CORPUS), k=k)
    tools = [generalist_tool(engine), python, search]
    if web:
        tools += [wikipedia_tool(endpoint=wikipedia_endpoint), web_search_tool()]
    return ordered(tools, order)


def ordered(tools: Sequence[BaseTool], order: Sequence[str]) -> list[BaseTool]:
    """Return `tools` with those `order` names first, in its order; the rest keep theirs."""
    rank = {name: index for index, name in enumerate(order)}
    return sorted(tools, key=lambda tool: rank.get(tool.name, len(rank)))


__all__ = [
    "BASE_TOOLS",
    "BUNDLED_CORPUS",
    "WEB_TOOLS",
    "CorpusRetriever",
    "Isolation",
    "SandboxUnavailableError",
    "corpus_documents",
    "default_tools",
    "generalist_tool",
    "local_search_tool",
    "python_coder_tool",
    "python_tool",
    "render_passages",
    "run_python",
    "web_search_tool",
    "wikipedia_tool",
]
