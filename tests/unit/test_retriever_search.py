from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import ToolException

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import build_agentflow
from flowlearn.nodes.tools import (
    CorpusRetriever,
    corpus_documents,
    default_tools,
    local_search_tool,
    render_passages,
)
from flowlearn.nodes.tools.local_search import tokenize

DOCS = [
    Document(
        "Paris is the capital and largest city of France.", id="d1", metadata={"title": "Paris"}
    ),
    Document("Berlin is the capital of Germany.", id="d2", metadata={"title": "Berlin"}),
    Document(
        "Lyon is a city in France known for its cuisine.", id="d3", metadata={"title": "Lyon"}
    ),
]


class OverlapRetriever(BaseRetriever):
    """Documents sharing a word with the query, most shared first: a retriever of our own."""

    documents: list[Document]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        words = set(tokenize(query))
        shared = [(len(words & set(tokenize(d.page_content))), d) for d in self.documents]
        return [d for count, d in sorted(shared, key=lambda pair: -pair[0]) if count]


class BrokenRetriever(BaseRetriever):
    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        raise ConnectionError("vector store unreachable")


class RetrieverEvents(BaseCallbackHandler):
    def __init__(self) -> None:
        self.queries: list[str] = []

    def on_retriever_start(self, serialized: Any, query: str, **kwargs: Any) -> None:
        self.queries.append(query)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    rows = [{"id": d.id, "title": d.metadata["title"], "text": d.page_content} for d in DOCS]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return path


def test_any_retriever_drives_the_tool_keeping_k_and_the_passage_format() -> None:
    tool = local_search_tool(retriever=OverlapRetriever(documents=DOCS), k=2)
    out = tool.invoke({"query": "largest city of France"})
    assert out == (
        "[1] (id: d1) Paris\nParis is the capital and largest city of France.\n\n"
        "[2] (id: d3) Lyon\nLyon is a city in France known for its cuisine."
    )  # the retriever found all three; k keeps two
    assert (
        local_search_tool(retriever=OverlapRetriever(documents=DOCS), k=5)
        .invoke({"query": "largest city of France"})
        .count("\n\n")
        == 2
    )
    assert tool.invoke({"query": "zebra"}) == "No passage matches the query."


def test_a_retriever_tool_offers_the_default_name_schema_and_notes(corpus: Path) -> None:
    mine = local_search_tool(retriever=OverlapRetriever(documents=DOCS))
    default = local_search_tool(corpus)
    assert mine.name == default.name == "local_search"
    assert mine.args == default.args == {"query": {"title": "Query", "type": "string"}}
    assert mine.metadata == default.metadata
    assert default.description.startswith("Search a local document collection (3 passages)")
    assert mine.description.startswith("Search a document collection by keywords")


def test_documents_render_with_fallbacks_for_id_and_title() -> None:
    out = render_passages(
        [
            Document("from metadata", metadata={"id": "m1", "title": "T"}),
            Document("no title", id="n1"),
            Document("no id", metadata={"title": "Untitled?"}),
        ]
    )
    assert out == "[1] (id: m1) T\nfrom metadata\n\n[2] (id: n1) \nno title\n\n[3] Untitled?\nno id"
    assert render_passages([]) == "No passage matches the query."


def test_the_default_index_as_a_retriever_renders_as_the_corpus_tool(corpus: Path) -> None:
    retriever = CorpusRetriever.from_corpus(corpus, k=2)
    (best, _) = retriever.invoke("capital of France")
    assert (best.id, best.metadata["title"], best.metadata["score"] > 0) == ("d1", "Paris", True)
    query = {"query": "capital of France"}
    assert (
        local_search_tool(retriever=retriever, k=2).invoke(query)
        == local_search_tool(corpus, k=2).invoke(query)
        == default_tools(FakeChatModel(), retriever=retriever, k=2)[-1].invoke(query)
    )
    assert [(d.id, d.metadata, d.page_content) for d in corpus_documents(corpus)][1] == (
        "d2",
        {"title": "Berlin"},
        "Berlin is the capital of Germany.",
    )


def test_retriever_failures_are_tool_errors_and_bad_arguments_are_refused(corpus: Path) -> None:
    with pytest.raises(ToolException, match=r"local_search failed: ConnectionError: vector store"):
        local_search_tool(retriever=BrokenRetriever()).invoke({"query": "x"})
    retriever = OverlapRetriever(documents=DOCS)
    with pytest.raises(ValueError, match="exactly one"):
        local_search_tool()
    with pytest.raises(ValueError, match="exactly one"):
        local_search_tool(corpus, retriever=retriever)
    with pytest.raises(ValueError, match="k >= 1"):
        local_search_tool(retriever=retriever, k=0)
    with pytest.raises(TypeError, match=r"BaseRetriever .* got list"):
        local_search_tool(retriever=DOCS)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        default_tools(FakeChatModel(), corpus=str(corpus), retriever=retriever)


def test_the_retrieval_runs_under_the_tool_calls_callbacks() -> None:
    events = RetrieverEvents()
    tool = local_search_tool(retriever=OverlapRetriever(documents=DOCS))
    tool.invoke({"query": "Germany"}, config={"callbacks": [events]})
    assert events.queries == ["Germany"]


def test_a_graph_searches_a_users_retriever_and_records_its_failures() -> None:
    engine = FakeChatModel(
        default_args={"query": "capital of Germany"},
        text="Conclusion: STOP <answer>Berlin</answer>",
    )
    mine = OverlapRetriever(documents=DOCS)
    for retriever, key, expected in [
        (mine, "result", "[1] (id: d2) Berlin\nBerlin is the capital of Germany."),
        (BrokenRetriever(), "error", "ToolException: local_search failed: ConnectionError"),
    ]:
        tools = default_tools(engine, retriever=retriever, k=1)
        state = build_agentflow(ScriptedPolicy([plan("local_search")]), engine, tools).invoke(
            {"question": "What is the capital of Germany?"}
        )
        step = state["memory"][0]
        assert step["tool"] == "local_search" and step[key].startswith(expected)


def test_langchain_communitys_bm25_retriever_plugs_in(corpus: Path) -> None:
    pytest.importorskip("rank_bm25")
    with warnings.catch_warnings():  # the package warns that it is being sunset
        warnings.simplefilter("ignore", DeprecationWarning)
        retrievers = pytest.importorskip("langchain_community.retrievers")
    bm25 = retrievers.BM25Retriever.from_documents(
        corpus_documents(corpus), k=5, preprocess_func=tokenize
    )
    out = local_search_tool(retriever=bm25, k=2).invoke({"query": "capital of Germany"})
    assert out.startswith("[1] (id: d2) Berlin\nBerlin is the capital of Germany.\n\n[2] (id: d")
    assert "[3]" not in out
