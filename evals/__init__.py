"""Evals: benchmark loaders, scorers shared with training, harness and reports."""

from flowlearn.evals.benchmarks import BENCHMARKS, Benchmark, load_benchmark, score_case
from flowlearn.evals.cases import Case, load_cases
from flowlearn.evals.harness import CaseResult, run_eval
from flowlearn.evals.reports import summarize, write_reports
from flowlearn.evals.scorers import Score

__all__ = [
    "BENCHMARKS",
    "Benchmark",
    "Case",
    "CaseResult",
    "Score",
    "load_benchmark",
    "load_cases",
    "run_eval",
    "score_case",
    "summarize",
    "write_reports",
]
