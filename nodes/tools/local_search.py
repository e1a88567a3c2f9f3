"""The `local_search` tool over any LangChain retriever; by default BM25 over a local JSONL corpus.

The default is the retriever to train against (as Search-R1 does): free, offline, no rate limits,
and the same query always returns the same passages. It is an inverted index of our own, kept
because over 100k passages it indexes faster than `langchain_community`'s `BM25Retriever` and
answers a query over 100 times faster (`python bench/retriever.py`: rank_bm25 scores every
passage for every query term). Any other `BaseRetriever` (that one, a vector store's
`.as_retriever()`, your own) plugs into the same tool.
"""

from __future__ import annotations

import heapq
import json
import math
import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import ConfigDict

from flowlearn.secrets import error_text

_TOKEN = re.compile(r"\w+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lower-case word tokens."""
    return _TOKEN.findall(text.lower())


@dataclass(frozen=True)
class Passage:
    """One corpus entry."""

    id: str
    title: str
    text: str


class BM25Index:
    """An inverted-index BM25 (Okapi, k1=0.9, b=0.4 as in Pyserini's defaults)."""

    def __init__(self, passages: list[Passage], *, k1: float = 0.9, b: float = 0.4) -> None:
        self.passages = passages
        self.k1, self.b = k1, b
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.lengths: list[int] = []
        for index, passage in enumerate(passages):
            counts = Counter(tokenize(f"{passage.title} {passage.text}"))
            self.lengths.append(sum(counts.values()))
            for term, count in counts.items():
                self.postings[term].append((index, count))
        self.average = sum(self.lengths) / max(len(self.lengths), 1)

    def search(self, query: str, k: int = 5) -> list[tuple[Passage, float]]:
        """Return the top `k` passages for `query` with their scores, best first."""
        n = len(self.passages)
        scores: dict[int, float] = defaultdict(float)
        for term in set(tokenize(query)):
            postings = self.postings.get(term)
            if not postings:
                continue
            idf = math.log(1 + (n - len(postings) + 0.5) / (len(postings) + 0.5))
            for index, count in postings:
                norm = self.k1 * (1 - self.b + self.b * self.lengths[index] / self.average)
                scores[index] += idf * count * (self.k1 + 1) / (count + norm)
        best = heapq.nlargest(k, scores.items(), key=lambda item: (item[1], -item[0]))
        return [(self.passages[index], score) for index, score in best]


def read_corpus(path: Path) -> list[Passage]:
    """Read `{"id", "title", "text"}` lines; a bad line is an error naming its line number."""
    passages = []
    with path.open(encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if not isinstance(row["text"], str):
                    raise TypeError(f"'text' must be a string, got {row['text']!r}")
                passages.append(Passage(str(row["id"]), str(row.get("title") or ""), row["text"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{number}: expected a JSON object with 'id' and 'text' "
                    f"(and optionally 'title'): {exc}"
                ) from exc
    return passages


@lru_cache(maxsize=4)
def _cached_index(path: str, mtime_ns: int, size: int) -> BM25Index:
    return BM25Index(read_corpus(Path(path)))


def load_index(corpus: str | os.PathLike[str]) -> BM25Index:
    """Build the index of a corpus file once; reuse it until the file changes."""
    path = Path(corpus).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(
            f"corpus {path} does not exist; pass a JSONL file with one "
            '{"id", "title", "text"} object per line'
        )
    stat = path.stat()
    return _cached_index(str(path), stat.st_mtime_ns, stat.st_size)


class CorpusRetriever(BaseRetriever):
    """A `BM25Index` as a LangChain retriever: the top `k` passages as Documents, best first.

    Each Document holds the passage's text, its id as `id` and its title and BM25 score in
    `metadata`, so `local_search` renders it exactly as the passage itself.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    index: BM25Index
    """The index searched."""
    k: int = 5
    """Passages returned per query."""

    @classmethod
    def from_corpus(cls, corpus: str | os.PathLike[str], *, k: int = 5) -> CorpusRetriever:
        """Return a retriever over a JSONL corpus, indexed once per file version."""
        return cls(index=load_index(corpus), k=k)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return [
            passage_document(passage, score=score)
            for passage, score in self.index.search(query, self.k)
        ]


def passage_document(passage: Passage, *, score: float | None = None) -> Document:
    """Return `passage` as a Document: its text, its id, its title (and score) in metadata."""
    metadata: dict[str, object] = {"title": passage.title}
    if score is not None:
        metadata["score"] = score
    return Document(page_content=passage.text, metadata=metadata, id=passage.id)


def corpus_documents(corpus: str | os.PathLike[str]) -> list[Document]:
    """Read a JSONL corpus as Documents, to build any LangChain retriever over it.

    For example `BM25Retriever.from_documents(corpus_documents("corpus.jsonl"), k=5)` (which
    scores `page_content`, the passage text, without its title).
    """
    return [passage_document(passage) for passage in read_corpus(Path(corpus).expanduser())]


def render_passages(documents: list[Document]) -> str:
    """Render Documents as numbered passages: `[rank] (id: ID) TITLE`, then the text.

    The id is the Document's `id` (else `metadata["id"]`), left out when it has none; the title
    is `metadata["title"]`, empty when absent.
    """
    if not documents:
        return "No passage matches the query."
    blocks = []
    for rank, document in enumerate(documents, 1):
        ident = document.id or document.metadata.get("id")
        title = document.metadata.get("title") or ""
        head = f"[{rank}] (id: {ident}) {title}" if ident else f"[{rank}] {title}"
        blocks.append(f"{head}\n{document.page_content}")
    return "\n\n".join(blocks)


def local_search_tool(
    corpus: str | os.PathLike[str] | None = None,
    *,
    k: int = 5,
    retriever: BaseRetriever | None = None,
) -> BaseTool:
    """Return `local_search`: the top-`k` passages, with ids, for a keyword query.

    Args:
        corpus: a JSONL corpus (`{"id", "title", "text"}` per line) to search with BM25
            (`CorpusRetriever`); give this or `retriever`.
        k: passages returned. With `retriever`, the tool keeps the first `k` Documents it
            returns; set the retriever to return at least `k` (e.g. `BM25Retriever(k=...)`,
            `as_retriever(search_kwargs={"k": ...})`: both return 4 by default).
        retriever: any LangChain `BaseRetriever`; its Documents render as passages (see
            `render_passages`), its failures come back as tool errors.

    Raises:
        ValueError: neither or both of `corpus` and `retriever`, or `k` below 1.
        TypeError: `retriever` is not a `BaseRetriever`.

    """
    if k < 1:
        raise ValueError(f"local_search_tool needs k >= 1, got {k}")
    search, collection = _retriever(corpus, retriever, k)

    def local_search(query: str, config: RunnableConfig) -> str:
        try:  # the config carries the tool call's callbacks, so traces nest the retrieval
            documents = search.invoke(query, config)
        except Exception as exc:
            raise ToolException(f"local_search failed: {error_text(exc)}") from exc
        return render_passages(documents[:k])

    return StructuredTool.from_function(
        local_search,
        name="local_search",
        description=f"Search {collection} by keywords and return the most relevant passages "
        "with their ids.",
        metadata={
            "usage_notes": "Use short keyword queries naming the entity you need.",
        },
    )


def _retriever(
    corpus: str | os.PathLike[str] | None, retriever: BaseRetriever | None, k: int
) -> tuple[BaseRetriever, str]:
    """Return the retriever to search and the collection as the tool's description names it."""
    if (corpus is None) == (retriever is None):
        raise ValueError("local_search_tool needs a corpus or a retriever (exactly one of them)")
    if corpus is not None:
        index = load_index(corpus)
        return CorpusRetriever(index=index, k=k), (
            f"a local document collection ({len(index.passages)} passages)"
        )
    if not isinstance(retriever, BaseRetriever):
        raise TypeError(
            "retriever must be a LangChain BaseRetriever (e.g. BM25Retriever, "
            f"vector_store.as_retriever()), got {type(retriever).__name__}"
        )
    return retriever, "a document collection"
