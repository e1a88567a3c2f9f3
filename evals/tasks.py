"""From names to work: a benchmark or a data file's cases plus the scorer that grades them.

`flowlearn eval`, `flowlearn collect` and training all resolve their data options here, so a
scorer name means the same everywhere and a bad one fails before any model loads.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from langchain_core.language_models import BaseChatModel

from flowlearn.evals.benchmarks import BENCHMARKS, load_benchmark
from flowlearn.evals.cases import Case, load_cases
from flowlearn.evals.scorers import SCORERS, CaseScorer, judge_scorer, scorer_named


def load_cases_and_scorer(
    *,
    benchmark: str | None = None,
    data: str | Path | None = None,
    scorer: str | None = None,
    limit: int | None = None,
    judge: Callable[[], BaseChatModel] | None = None,
    data_dir: str | Path | None = None,
) -> tuple[list[Case], CaseScorer]:
    """Resolve a benchmark or data file, a limit and a scorer name (or a judge) into work.

    Args:
        benchmark: a registered benchmark's name; exactly one of it and `data`.
        data: a .json/.jsonl/.parquet file of cases.
        scorer: a name in `SCORERS`; default: the benchmark's. A data file needs one (or a
            judge).
        limit: use only the first N cases.
        judge: builds a chat model that grades answers against the references instead of a
            rule scorer; called only once the options and cases check out.
        data_dir: the benchmarks folder (default: the files shipped in the package).

    Raises:
        ValueError: bad options or an unreadable data file, with a message saying which.

    """
    if (benchmark is None) == (data is None):
        raise ValueError("give exactly one of --benchmark NAME or --data PATH")
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be >= 1, got {limit}")
    if benchmark is not None and benchmark not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(sorted(BENCHMARKS))}")
    name = scorer or (BENCHMARKS[benchmark].scorer if benchmark else None)
    if name is None and judge is None:
        raise ValueError("--data needs --scorer (or --judge) to know how to score answers")
    if name is not None and judge is None and name not in SCORERS:
        raise ValueError(f"unknown scorer {name!r}; known: {', '.join(sorted(SCORERS))}")
    try:
        cases = (
            load_benchmark(benchmark, limit=limit, data_dir=data_dir)
            if benchmark is not None
            else load_cases(str(data), limit=limit)
        )
    except (OSError, KeyError) as exc:
        raise ValueError(exc.args[0] if isinstance(exc, KeyError) else str(exc)) from exc
    return cases, judge_scorer(judge()) if judge is not None else scorer_named(str(name))
