"""BM25 over 100k passages: our inverted index vs langchain-community's BM25Retriever, side by side.

Run: `python bench/retriever.py [--passages 100000] [--queries 200] [--repeats 3]` (needs
`pip install 'flowlearn[retrievers]'`). Both arms are LangChain retrievers over the same synthetic
passages (`bench/local_search.py`'s), with the same tokens (`tokenize`), the same k1=0.9, b=0.4
and both title and text scored, and both are timed through `retriever.invoke`, the call the
`local_search` tool makes:

1. `ours`: `CorpusRetriever` over a `BM25Index` (postings per term; a query touches only the
   passages holding one of its terms);
2. `library`: `BM25Retriever.from_documents` (rank_bm25's `BM25Okapi`, which scores every passage
   for every query term).

After an untimed warm-up (both indexes built, and `--warm-up` queries (10) on each), each repeat
(`--repeats`, 3) builds both indexes, the arms' order reversed every other repeat, then runs the
same `--queries` (200) on both, interleaved query by query, the arm going first alternating, so
that load on the machine falls on both alike. The figures are the median and min-max of the pair
ratios library/ours (one a repeat) of the index seconds and of the mean ms a query; prints each
arm's medians, the ratios and how often the two agree on the best passage. Writes every repeat's
values, the provenance (commit, command, machine, load) and the `headlines` to
bench/results/retriever.json (`--out`) and a summary beside it (.txt). About 3 minutes at the
defaults on 2 CPU cores (estimated from the kept result's seconds).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from local_search import synthetic
from measure import (
    RESULTS,
    alternate,
    check_repeats,
    figure_line,
    headline,
    provenance,
    ratios,
    spread,
    write_result,
)

from flowlearn.nodes.tools.local_search import BM25Index, CorpusRetriever, Passage, tokenize

K = 5


def library_retriever(documents: list[Document]) -> BaseRetriever:
    with warnings.catch_warnings():  # the package warns that it is being sunset
        warnings.simplefilter("ignore", DeprecationWarning)
        from langchain_community.retrievers import BM25Retriever

    return BM25Retriever.from_documents(
        documents, k=K, preprocess_func=tokenize, bm25_params={"k1": 0.9, "b": 0.4}
    )


class Arms:
    """Both retrievers over the same passages: building them, and the interleaved queries."""

    def __init__(self, passages: list[Passage], texts: list[str]) -> None:
        self.passages, self.texts = passages, texts
        self.documents = [Document(page_content=f"{p.title} {p.text}", id=p.id) for p in passages]
        self.built: dict[str, BaseRetriever | None] = {"ours": None, "library": None}
        self.query_ms: dict[str, list[float]] = {"ours": [], "library": []}
        self.query_median_ms: dict[str, list[float]] = {"ours": [], "library": []}
        self.agree: list[int] = []

    def build(self, name: str) -> float:
        self.built[name] = None  # let the last one go first
        start = time.perf_counter()
        if name == "ours":
            self.built[name] = CorpusRetriever(index=BM25Index(self.passages), k=K)
        else:
            self.built[name] = library_retriever(self.documents)
        return time.perf_counter() - start

    def query(self, texts: list[str]) -> tuple[dict[str, list[float]], int]:
        """Each query on both arms, the arm going first alternating; seconds and agreements."""
        seconds: dict[str, list[float]] = {name: [] for name in self.built}
        agree = 0
        for number, text in enumerate(texts):
            order = list(self.built) if number % 2 == 0 else list(reversed(self.built))
            best = {}
            for name in order:
                retriever = self.built[name]
                assert retriever is not None
                start = time.perf_counter()
                found = retriever.invoke(text)
                seconds[name].append(time.perf_counter() - start)
                best[name] = found[0].id if found else None
            agree += best["ours"] == best["library"]
        return seconds, agree

    def after_builds(self, repeat: int, built: dict[str, float]) -> None:
        seconds, agree = self.query(self.texts)
        for name, values in seconds.items():
            self.query_ms[name].append(1000 * statistics.mean(values))
            self.query_median_ms[name].append(1000 * statistics.median(values))
        self.agree.append(agree)
        print(
            f"  repeat {repeat + 1}: "
            + ", ".join(
                f"{name} index {built[name]:.2f} s, query {self.query_ms[name][-1]:.3f} ms"
                for name in built
            )
            + f"; same best passage {agree}/{len(self.texts)}",
            flush=True,
        )


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=100_000, help="corpus size (100000)")
    parser.add_argument("--queries", type=int, default=200, help="queries per arm (200)")
    parser.add_argument("--warm-up", type=int, default=10, help="untimed queries per arm (10)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each arm (3)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS / "retriever.json", help="JSON path (.txt beside it)"
    )
    args = parser.parse_args(argv)
    check_repeats(args.repeats)
    if args.passages < 1 or args.queries < 1:
        parser.error("--passages and --queries: at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    passages = synthetic(args.passages)
    rng = random.Random(1)
    texts = [
        " ".join(rng.sample(passages[rng.randrange(len(passages))].text.split(), 4))
        for _ in range(args.queries + args.warm_up)
    ]
    arms = Arms(passages, texts[: args.queries])
    print(f"{args.passages} passages, {args.repeats} repeats ...", flush=True)
    for name in arms.built:  # untimed
        arms.build(name)
    arms.query(texts[args.queries :])
    build = alternate(
        {name: lambda name=name: arms.build(name) for name in arms.built},
        args.repeats,
        warm_up=False,
        on_repeat=arms.after_builds,
    )
    report: dict[str, Any] = provenance("retriever.py", argv) | {
        "passages": args.passages,
        "queries": args.queries,
        "k": K,
        "repeats": args.repeats,
        **{
            name: {
                "build_seconds": spread(build[name]),
                "query_ms": spread(arms.query_ms[name]),
                "query_ms_median": spread(arms.query_median_ms[name]),
            }
            for name in arms.built
        },
        "build_ratio_library_over_ours": ratios(build["library"], build["ours"]),
        "query_ratio_library_over_ours": ratios(arms.query_ms["library"], arms.query_ms["ours"]),
        "same_best_passage": [agree / args.queries for agree in arms.agree],
    }
    both = f"{args.passages} synthetic passages, the same tokens, k1 and b"
    report["headlines"] = [
        headline(
            "BM25 index, langchain-community over ours",
            report["build_ratio_library_over_ours"],
            "x",
            f"building BM25Retriever vs our CorpusRetriever over {both}",
        ),
        headline(
            "BM25 query, langchain-community over ours",
            report["query_ratio_library_over_ours"],
            "x",
            f"mean ms of {args.queries} four-word queries through retriever.invoke, "
            f"BM25Retriever vs our CorpusRetriever over {both}",
        ),
    ]
    text = summary(report, args)
    print(text)
    write_result(args.out, report)
    args.out.with_suffix(".txt").write_text(text + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.txt')}")
    return 0


def summary(report: dict[str, Any], args: argparse.Namespace) -> str:
    lines = [f"# {report['command']}", f"# {report['date']}, {report['machine']['platform']}"]
    for name in ("ours", "library"):
        arm = report[name]
        lines.append(
            f"{name:<8} index {arm['build_seconds']['median']:6.2f} s   query "
            f"{arm['query_ms']['median']:8.3f} ms (median of {args.repeats} repeats' means)"
        )
    agree = ", ".join(f"{share:.1%}" for share in report["same_best_passage"])
    lines += [
        figure_line("build_ratio_library_over_ours", report["build_ratio_library_over_ours"]),
        figure_line("query_ratio_library_over_ours", report["query_ratio_library_over_ours"]),
        f"same best passage in {agree} of the queries (a repeat each)",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
