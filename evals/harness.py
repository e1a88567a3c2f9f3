"""Run a graph over evaluation cases, concurrently, resumably, with a progress bar."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score

logger = logging.getLogger(__name__)

CaseScorer = Callable[[str, Case], Score]


@dataclass
class CaseResult:
    """What one case produced; one JSON line of the results file."""

    id: str
    query: str
    reference: Any
    answer: str
    score: float
    reason: str
    turns: int
    tools: list[str] = field(default_factory=list)
    format_errors: int = 0
    seconds: float = 0.0
    termination: str | None = None
    error: str | None = None


def summarize_run(case: Case, state: dict[str, Any], score: Score, seconds: float) -> CaseResult:
    """Build a case's result from the flow's final state."""
    memory = state.get("memory", [])
    return CaseResult(
        id=case.id,
        query=case.query,
        reference=case.reference,
        answer=state.get("answer", ""),
        score=score.value,
        reason=score.reason,
        turns=state.get("turn", 0),
        tools=[r["tool"] for r in memory if r.get("kind") == "action"],
        format_errors=sum(r.get("kind") == "format_error" for r in memory),
        seconds=round(seconds, 3),
        termination=state.get("termination"),
    )


def read_results(path: Path) -> list[CaseResult]:
    """Read a results file, skipping a torn last line (a crash mid-write) with a warning."""
    if not path.exists():
        return []
    results = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            results.append(CaseResult(**json.loads(line)))
        except (ValueError, TypeError):
            if number == len(lines):
                logger.warning("%s: skipping a torn last line (an interrupted write)", path)
                continue
            raise ValueError(f"{path}:{number} is not a result line; move the file away") from None
    return results


def run_eval(
    graph_or_factory: Any,
    cases: Sequence[Case],
    scorer: CaseScorer,
    *,
    concurrency: int = 4,
    results_path: str | Path | None = None,
    context: Any = None,
    progress: bool = True,
) -> list[CaseResult]:
    """Run every case through the graph and score its answer.

    Args:
        graph_or_factory: a compiled graph, or a zero-argument function returning one.
        cases: the cases; ids must be unique.
        scorer: `(answer, case) -> Score`, e.g. from `flowlearn.evals.benchmarks.score_case`.
        concurrency: cases in flight at once (threads).
        results_path: a JSONL file; cases already in it are not run again (resume), and each
            new result is appended and flushed as soon as it is known.
        context: the graph's `Context` for every run.
        progress: show a tqdm progress bar.

    A case whose run raises is recorded with score 0 and the error; it never stops the eval.

    """
    ids = [case.id for case in cases]
    if len(set(ids)) != len(ids):
        raise ValueError("case ids must be unique; duplicates would make resuming ambiguous")
    graph = graph_or_factory if hasattr(graph_or_factory, "invoke") else graph_or_factory()
    path = Path(results_path) if results_path is not None else None
    done = {r.id: r for r in read_results(path)} if path else {}
    todo = [case for case in cases if case.id not in done]
    lock = threading.Lock()
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)

    def run_one(case: Case) -> CaseResult:
        start = time.perf_counter()
        try:
            state = graph.invoke({"question": case.query}, context=context)
            score = scorer(state.get("answer", ""), case)
            result = summarize_run(case, state, score, time.perf_counter() - start)
        except Exception as exc:
            result = CaseResult(
                id=case.id,
                query=case.query,
                reference=case.reference,
                answer="",
                score=0.0,
                reason="run failed",
                turns=0,
                seconds=round(time.perf_counter() - start, 3),
                error=f"{type(exc).__name__}: {exc}",
            )
        if path:
            with lock, path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(asdict(result), ensure_ascii=False, default=str) + "\n")
                handle.flush()
        return result

    from tqdm.auto import tqdm

    fresh: dict[str, CaseResult] = {}
    with (
        ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool,
        tqdm(
            total=len(cases),
            initial=len(cases) - len(todo),
            disable=not progress,
            desc="eval",
            unit="case",
        ) as bar,
    ):
        for future in as_completed([pool.submit(run_one, case) for case in todo]):
            result = future.result()
            fresh[result.id] = result
            bar.update(1)
    merged = {**done, **fresh}
    return [merged[case.id] for case in cases]
