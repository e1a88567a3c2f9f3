"""Evals: benchmark loaders, scorers shared with training, harness and reports.

Each name imports its module on first use (PEP 562): the benchmark and scorer tables the CLI's
options list load without the harness, its graph runner or LangChain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowlearn.lazy import lazy_attribute, lazy_dir

if TYPE_CHECKING:
    from flowlearn.evals.benchmarks import BENCHMARKS, Benchmark, load_benchmark, score_case
    from flowlearn.evals.cases import Case, load_cases
    from flowlearn.evals.harness import CaseResult, run_eval
    from flowlearn.evals.reports import summarize, write_reports
    from flowlearn.evals.scorers import SCORERS, CaseScorer, Score
    from flowlearn.evals.tasks import load_cases_and_scorer

_LAZY = {
    **dict.fromkeys(
        ("BENCHMARKS", "Benchmark", "load_benchmark", "score_case"), "flowlearn.evals.benchmarks"
    ),
    **dict.fromkeys(("Case", "load_cases"), "flowlearn.evals.cases"),
    **dict.fromkeys(("CaseResult", "run_eval"), "flowlearn.evals.harness"),
    **dict.fromkeys(("summarize", "write_reports"), "flowlearn.evals.reports"),
    **dict.fromkeys(("SCORERS", "CaseScorer", "Score"), "flowlearn.evals.scorers"),
    "load_cases_and_scorer": "flowlearn.evals.tasks",
}
"""Each public name and the module that defines it, imported on first use."""


def __getattr__(name: str) -> Any:
    """Import a public name from its module on first use, and keep it."""
    return lazy_attribute(name, _LAZY, globals())


def __dir__() -> list[str]:
    """List the public names beside the module's own."""
    return lazy_dir(_LAZY, globals())


__all__ = [
    "BENCHMARKS",
    "SCORERS",
    "Benchmark",
    "Case",
    "CaseResult",
    "CaseScorer",
    "Score",
    "load_benchmark",
    "load_cases",
    "load_cases_and_scorer",
    "run_eval",
    "score_case",
    "summarize",
    "write_reports",
]
