"""The `local_search` tool: BM25 over a local JSONL corpus; free, deterministic and offline.

This is the retriever to train against (as Search-R1 does): no API costs, no rate limits, and the
same query always returns the same passages.
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

from langchain_core.tools import BaseTool, StructuredTool

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


def local_search_tool(corpus: str | os.PathLike[str], *, k: int = 5) -> BaseTool:
    """Return `local_search`: BM25 top-`k` passages, with ids, from a local JSONL corpus."""
    index = load_index(corpus)

    def local_search(query: str) -> str:
        hits = index.search(query, k)
        if not hits:
            return "No passage matches the query."
        return "\n\n".join(
            f"[{rank}] (id: {p.id}) {p.title}\n{p.text}" for rank, (p, _) in enumerate(hits, 1)
        )

    return StructuredTool.from_function(
        local_search,
        name="local_search",
        description=f"Search a local document collection ({len(index.passages)} passages) "
        "by keywords and return the most relevant passages with their ids.",
        metadata={
            "usage_notes": "Use short keyword queries naming the entity you need.",
        },
    )
