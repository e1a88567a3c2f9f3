"""Index and query BM25 over 10k and 100k synthetic passages; seconds, ms a query and the ratios.

Run: `python bench/local_search.py [--small 10000] [--large 100000] [--queries 200]
[--repeats 3]`. The passages (60 words each from 50k) and the four-word queries are made once per
size, untimed. After an untimed warm-up of each size, each size is indexed (`BM25Index`) and
searched (`--queries`, top 5) `--repeats` times (3), the sizes' order reversed every other
repeat. The figures are the median and min-max of the large size's index seconds and ms a query,
and of the pair ratios large/small (one a repeat). Writes every repeat's values, the provenance
(commit, command, machine, load) and the `headlines` to bench/results/local_search.json
(`--out`). About 45 s at the defaults on 2 CPU cores (four 100k indexes).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

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

from flowlearn.nodes.tools.local_search import BM25Index, Passage


def synthetic(n: int, seed: int = 0) -> list[Passage]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(50_000)]
    return [Passage(str(i), f"title {i}", " ".join(rng.choices(vocab, k=60))) for i in range(n)]


def queries(passages: list[Passage], count: int) -> list[str]:
    rng = random.Random(1)
    n = len(passages)
    return [" ".join(rng.sample(passages[rng.randrange(n)].text.split(), 4)) for _ in range(count)]


class Size:
    """One corpus size; `once()` indexes and searches it, keeping the query ms, and returns the
    index seconds."""

    def __init__(self, n: int, count: int) -> None:
        self.passages = synthetic(n)
        self.texts = queries(self.passages, count)
        self.query_ms: list[float] = []

    def run(self) -> tuple[float, float]:
        start = time.perf_counter()
        index = BM25Index(self.passages)
        build = time.perf_counter() - start
        start = time.perf_counter()
        for text in self.texts:
            index.search(text, 5)
        return build, (time.perf_counter() - start) / len(self.texts) * 1000

    def warm_up(self) -> float:
        self.run()
        return 0.0

    def once(self) -> float:
        build, query_ms = self.run()
        self.query_ms.append(query_ms)
        return build


def size_name(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000, help="passages (10000)")
    parser.add_argument("--large", type=int, default=100_000, help="passages (100000)")
    parser.add_argument("--queries", type=int, default=200, help="queries a size (200)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each size (3)")
    parser.add_argument("--out", type=Path, default=RESULTS / "local_search.json", help="JSON path")
    args = parser.parse_args(argv)
    check_repeats(args.repeats)
    if not 0 < args.small < args.large or args.queries < 1:
        parser.error("--small and --large: 0 < small < large; --queries: at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    small, large = size_name(args.small), size_name(args.large)
    sizes = {small: Size(args.small, args.queries), large: Size(args.large, args.queries)}
    print(f"{small} and {large} passages, {args.repeats} repeats ...", flush=True)
    for size in sizes.values():  # untimed
        size.warm_up()

    def report(repeat: int, built: dict[str, float]) -> None:
        print(
            f"  repeat {repeat + 1}: "
            + ", ".join(
                f"{k} index {v:.2f} s, query {sizes[k].query_ms[-1]:.3f} ms"
                for k, v in built.items()
            )
        )

    build = alternate({k: s.once for k, s in sizes.items()}, args.repeats, False, report)
    query = {k: s.query_ms for k, s in sizes.items()}
    result: dict[str, Any] = provenance("local_search.py", argv) | {
        "settings": {"repeats": args.repeats, "queries": args.queries, "k": 5},
        **{
            name: {
                "passages": n,
                "build_seconds": spread(build[name]),
                "query_ms": spread(query[name]),
            }
            for name, n in ((small, args.small), (large, args.large))
        },
        f"build_ratio_{large}_over_{small}": ratios(build[large], build[small]),
        f"query_ratio_{large}_over_{small}": ratios(query[large], query[small]),
    }
    result["headlines"] = [
        headline(
            f"BM25 index, {large} passages",
            result[large]["build_seconds"],
            "s",
            f"BM25Index built over {large} synthetic passages of 60 words",
        ),
        headline(
            f"BM25 query, {large} passages",
            result[large]["query_ms"],
            "ms",
            f"a four-word query's top 5 from the {large}-passage index, mean of {args.queries}",
        ),
    ]
    write_result(args.out, result)
    print(figure_line(f"{large}_build_seconds", result[large]["build_seconds"]))
    print(figure_line(f"{large}_query_ms", result[large]["query_ms"]))
    print(
        figure_line(
            f"build_ratio_{large}_over_{small}", result[f"build_ratio_{large}_over_{small}"]
        )
    )
    print(
        figure_line(
            f"query_ratio_{large}_over_{small}", result[f"query_ratio_{large}_over_{small}"]
        )
        + f"; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
