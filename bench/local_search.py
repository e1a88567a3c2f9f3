"""Index and query BM25 over 10k and 100k synthetic passages; print seconds and the ratio.

Run: `python bench/local_search.py`. Writes bench/results/local_search.json.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from flowlearn.nodes.tools.local_search import BM25Index, Passage

RESULTS = Path(__file__).parent / "results" / "local_search.json"


def synthetic(n: int, seed: int = 0) -> list[Passage]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(50_000)]
    return [Passage(str(i), f"title {i}", " ".join(rng.choices(vocab, k=60))) for i in range(n)]


def measure(n: int, queries: int = 200) -> dict[str, float]:
    passages = synthetic(n)
    start = time.perf_counter()
    index = BM25Index(passages)
    build = time.perf_counter() - start
    rng = random.Random(1)
    texts = [
        " ".join(rng.sample(passages[rng.randrange(n)].text.split(), 4)) for _ in range(queries)
    ]
    start = time.perf_counter()
    for text in texts:
        index.search(text, 5)
    query_ms = (time.perf_counter() - start) / queries * 1000
    return {"passages": n, "build_seconds": round(build, 3), "query_ms": round(query_ms, 3)}


def main() -> None:
    small, large = measure(10_000), measure(100_000)
    report = {
        "small": small,
        "large": large,
        "build_ratio_100k_over_10k": round(large["build_seconds"] / small["build_seconds"], 2),
        "query_ratio_100k_over_10k": round(large["query_ms"] / small["query_ms"], 2),
    }
    print(json.dumps(report, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
