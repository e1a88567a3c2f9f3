"""Evals: benchmark loaders, scorers shared with training, harness and reports."""

from flowlearn.evals.benchmarks import BENCHMARKS, Benchmark, load_benchmark, score_case
from flowlearn.evals.cases import Case, load_cases
from flowlearn.evals.harness import CaseResult, run_eval
from flowlearn.evals.reports import summarize, write_reports
from flowlearn.evals.scorers import SCORERS, CaseScorer, Score
from flowlearn.evals.tasks import load_cases_and_scorer

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
