"""BM25 over 100k passages: our inverted index vs langchain-community's BM25Retriever, side by side.

Run: `python bench/retriever.py [--passages 100000] [--queries 200]` (needs
`pip install 'flowlearn[retrievers]'`). Both arms are LangChain retrievers over the same synthetic
passages (`bench/local_search.py`'s), with the same tokens (`tokenize`), the same k1=0.9, b=0.4
and both title and text scored, and both are timed through `retriever.invoke`, the call the
`local_search` tool makes:

1. `ours`: `CorpusRetriever` over a `BM25Index` (postings per term; a query touches only the
   passages holding one of its terms);
2. `library`: `BM25Retriever.from_documents` (rank_bm25's `BM25Okapi`, which scores every passage
   for every query term).

Indexing is timed once per arm; queries are interleaved, the arm going first alternating, so
that load on the machine falls on both alike. Prints seconds, milliseconds and ratios (library
over ours), how often the two agree on the best passage, and writes
bench/results/retriever.json and .txt.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from local_search import synthetic

from flowlearn.nodes.tools.local_search import BM25Index, CorpusRetriever, tokenize

RESULTS = Path(__file__).parent / "results" / "retriever"
K = 5


def library_retriever(documents: list[Document]) -> BaseRetriever:
    with warnings.catch_warnings():  # the package warns that it is being sunset
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.retrievers import BM25Retriever

    return BM25Retriever.from_documents(
        documents, k=K, preprocess_func=tokenize, bm25_params={"k1": 0.9, "b": 0.4}
    )


def timed(build: Callable[[], BaseRetriever]) -> tuple[BaseRetriever, float]:
    start = time.perf_counter()
    built = build()
    return built, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000, help="corpus size (100000)")
    parser.add_argument("--queries", type=int, default=200, help="queries per arm (200)")
    args = parser.parse_args(argv)
    passages = synthetic(args.passages)
    documents = [Document(page_content=f"{p.title} {p.text}", id=p.id) for p in passages]
    ours, ours_build = timed(lambda: CorpusRetriever(index=BM25Index(passages), k=K))
    library, library_build = timed(lambda: library_retriever(documents))
    arms = {"ours": ours, "library": library}
    rng = random.Random(1)
    texts = [
        " ".join(rng.sample(passages[rng.randrange(len(passages))].text.split(), 4))
        for _ in range(args.queries)
    ]
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    agree = 0
    for number, text in enumerate(texts):
        order = list(arms) if number % 2 == 0 else list(reversed(arms))
        best = {}
        for name in order:
            start = time.perf_counter()
            found = arms[name].invoke(text)
            seconds[name].append(time.perf_counter() - start)
            best[name] = found[0].id if found else None
        agree += best["ours"] == best["library"]
    query_ms = {name: 1000 * statistics.mean(times) for name, times in seconds.items()}
    median_ms = {name: 1000 * statistics.median(times) for name, times in seconds.items()}
    report = {
        "passages": args.passages,
        "queries": args.queries,
        "k": K,
        "ours": {
            "build_seconds": round(ours_build, 3),
            "query_ms": round(query_ms["ours"], 3),
            "query_ms_median": round(median_ms["ours"], 3),
        },
        "library": {
            "build_seconds": round(library_build, 3),
            "query_ms": round(query_ms["library"], 3),
            "query_ms_median": round(median_ms["library"], 3),
        },
        "build_ratio_library_over_ours": round(library_build / ours_build, 2),
        "query_ratio_library_over_ours": round(query_ms["library"] / query_ms["ours"], 1),
        "same_best_passage": round(agree / args.queries, 3),
        "host": f"{platform.platform()}, Python {platform.python_version()}",
    }
    text = "\n".join(
        [
            f"# python bench/retriever.py --passages {args.passages} --queries {args.queries}",
            f"# {report['host']}",
            f"ours     index {ours_build:6.2f} s   query {query_ms['ours']:8.3f} ms "
            f"(median {median_ms['ours']:.3f})",
            f"library  index {library_build:6.2f} s   query {query_ms['library']:8.3f} ms "
            f"(median {median_ms['library']:.3f})",
            f"library / ours: index {report['build_ratio_library_over_ours']}x, "
            f"query {report['query_ratio_library_over_ours']}x; "
            f"same best passage in {agree}/{args.queries} queries",
        ]
    )
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    RESULTS.with_suffix(".txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
