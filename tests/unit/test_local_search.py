from __future__ import annotations

import json
from pathlib import Path

import pytest

from fakes import FakeChatModel
from flowlearn.compose import FlowSpec, build_tools
from flowlearn.nodes.tools import default_tools, local_search_tool
from flowlearn.nodes.tools.local_search import load_index

DOCS = [
    {"id": "d1", "title": "Paris", "text": "Paris is the capital and largest city of France."},
    {"id": "d2", "title": "Berlin", "text": "Berlin is the capital of Germany."},
    {"id": "d3", "title": "Lyon", "text": "Lyon is a city in France known for its cuisine."},
]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(d) for d in DOCS) + "\n")
    return path


def test_known_query_returns_known_passage_first(corpus: Path) -> None:
    out = local_search_tool(corpus, k=2).invoke({"query": "capital of France"})
    assert out.startswith("[1] (id: d1) Paris")
    assert "[2]" in out and "[3]" not in out


def test_index_is_built_once_and_rebuilt_when_file_changes(corpus: Path) -> None:
    first = load_index(corpus)
    assert load_index(corpus) is first
    corpus.write_text(corpus.read_text() + json.dumps({"id": "d4", "text": "Rome"}) + "\n")
    assert len(load_index(corpus).passages) == 4


def test_no_match_and_bad_corpus(corpus: Path, tmp_path: Path) -> None:
    assert local_search_tool(corpus).invoke({"query": "zebra"}) == "No passage matches the query."
    with pytest.raises(FileNotFoundError, match="does not exist"):
        local_search_tool(tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "1", "text": "ok"}\n{"title": "no id"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object with 'id'"):
        local_search_tool(bad)


def test_default_tools_add_local_search_for_a_corpus(
    corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = FakeChatModel()
    monkeypatch.delenv("FLOWLEARN_CORPUS", raising=False)
    assert [t.name for t in default_tools(engine)] == ["generalist", "python", "local_search"]
    bundled = default_tools(engine, order=("local_search",))  # a prompt set's tool_order
    assert [t.name for t in bundled] == ["local_search", "generalist", "python"]
    assert bundled[0].invoke({"query": "capital of Kenya"}).startswith("[1] (id: cap-")
    assert "Nairobi" in bundled[0].invoke({"query": "capital of Kenya"}).split("\n\n")[0]
    assert "(id: d1) Paris" in default_tools(engine, corpus=str(corpus))[-1].invoke(
        {"query": "capital of France"}
    )
    monkeypatch.setenv("FLOWLEARN_CORPUS", str(corpus))
    monkeypatch.setenv("FLOWLEARN_WEB_TOOLS", "1")
    monkeypatch.setenv("TAVILY_API_KEY", "tvly-test")
    assert [t.name for t in default_tools(engine)] == ["generalist", "python", "local_search"]
    spec = FlowSpec.from_env()  # only the composition root reads the environment
    assert spec.corpus == str(corpus) and spec.web
    search = {t.name: t for t in build_tools(spec, engine)}["local_search"]
    assert "(id: d1) Paris" in search.invoke({"query": "capital of France"})
    assert FlowSpec.from_env(corpus="x.jsonl", web=False).corpus == "x.jsonl"
