"""Run a graph over evaluation cases, concurrently, resumably, with a progress bar."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flowlearn.evals.cases import Case
from flowlearn.evals.runner import run_resumable
from flowlearn.evals.scorers import CaseScorer, Score
from flowlearn.files import JsonlFile
from flowlearn.secrets import error_text


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
        error=engine_failure(state),
    )


def engine_failure(state: dict[str, Any]) -> str | None:
    """Return the recorded error of the model call that ended a run on `engine_error`, or None.

    A failed call is recorded, not raised (the run still writes its answer), so the result
    names it here: a server that answered 401 or never answered is not a wrong answer.
    """
    if state.get("termination") != "engine_error":
        return None
    failed = [t for t in state.get("transitions", []) if t.get("parse_status") == "error"]
    ending = [t for t in failed if t.get("node") != "generator"] or failed  # the loop's last
    return str(ending[-1].get("output")) if ending else None


def read_results(path: str | Path) -> list[CaseResult]:
    """Read a results file, skipping undecodable (torn) lines with a warning.

    Raises:
        ValueError: a line that is JSON but not a result, named by file and line.

    """
    file = JsonlFile(path)
    results = []
    for number, data in file.read():
        try:
            results.append(CaseResult(**data))
        except TypeError:
            raise ValueError(
                f"{file.path}:{number} is not a result line; move the file away"
            ) from None
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
    states_path: str | Path | None = None,
) -> list[CaseResult]:
    """Run every case through the graph and score its answer.

    Args:
        graph_or_factory: a compiled graph, or a zero-argument function returning one.
        cases: the cases; ids must be unique.
        scorer: `(answer, case) -> Score`, e.g. `flowlearn.evals.scorers.SCORERS["token_f1"]`.
        concurrency: cases in flight at once (threads).
        results_path: a JSONL file; cases already in it are not run again (resume), and each
            new result is appended durably as soon as it is known.
        context: the graph's `Context` for every run.
        progress: show a tqdm progress bar.
        states_path: a JSONL file to append each freshly run case's final state to (its id,
            score, memory, answer and transitions), to see why it scored as it did; written
            after the case's result, so a kill and resume never saves a case twice.

    A case whose run raises is recorded with score 0 and the error; it never stops the eval.

    """
    ids = [case.id for case in cases]
    if len(set(ids)) != len(ids):
        raise ValueError("case ids must be unique; duplicates would make resuming ambiguous")
    graph = graph_or_factory if hasattr(graph_or_factory, "invoke") else graph_or_factory()
    file = JsonlFile(results_path) if results_path is not None else None
    states = JsonlFile(states_path) if states_path is not None else None
    # A case's state is written after its result, so a run killed between the two leaves the
    # state out (the result is kept; the case is not run again) rather than saving it twice;
    # ids a states file already holds (an older flowlearn wrote states first) are not repeated.
    pending: dict[str, dict[str, Any]] = {}
    kept = {r.get("id") for r in states.records() if isinstance(r, dict)} if states else set()

    def keep(case: Case, state: dict[str, Any], score: Score) -> None:
        pending[case.id] = {"id": case.id, "score": score.value, **state}

    def save(result: CaseResult) -> None:
        if file is not None:
            file.append(asdict(result))
        state = pending.pop(result.id, None)
        if states is not None and state is not None and result.id not in kept:
            states.append(state)

    done = {r.id: r for r in read_results(file.path)} if file else {}
    fresh = run_resumable(
        {case.id: case for case in cases},
        lambda case: run_case(graph, case, scorer, context, keep=keep if states else None),
        done=done,
        save=save if file or states else None,
        concurrency=concurrency,
        progress=progress,
        label="eval",
        unit="case",
    )
    merged = {**done, **fresh}
    return [merged[case.id] for case in cases if case.id in merged]


def run_case(
    graph: Any,
    case: Case,
    scorer: CaseScorer,
    context: Any = None,
    *,
    keep: Callable[[Case, dict[str, Any], Score], object] | None = None,
) -> CaseResult:
    """Run one case through the graph and score it; a failed run is a result with its error.

    `keep`, when given, is called with the case, its final state and its score.

    The error is recorded with known secrets redacted (`flowlearn.secrets`).
    """
    start = time.perf_counter()
    try:
        state = graph.invoke({"question": case.query}, context=context)
        score = scorer(state.get("answer", ""), case)
        if keep is not None:
            keep(case, state, score)
        return summarize_run(case, state, score, time.perf_counter() - start)
    except Exception as exc:
        return CaseResult(
            id=case.id,
            query=case.query,
            reference=case.reference,
            answer="",
            score=0.0,
            reason="run failed",
            turns=0,
            seconds=round(time.perf_counter() - start, 3),
            error=error_text(exc),  # a server's 401 may echo its token: never stored
        )
