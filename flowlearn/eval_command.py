"""`flowlearn eval --benchmark NAME`: run a benchmark through the flow and write reports."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flowlearn.flow_setup import UsageError, add_flow_options, build_flow

SCORERS = ("exact_match", "math_equal", "game24", "multiple_choice")


def add_parser(commands: Any) -> None:
    """Register the `eval` subcommand."""
    from flowlearn.evals.benchmarks import BENCHMARKS

    parser = commands.add_parser(
        "eval",
        help="evaluate the flow on a benchmark",
        description="Run a benchmark's cases through the flow (resumable), score the answers "
        "and write report.json, report.md and report.png.",
    )
    source = parser.add_argument_group("data")
    source.add_argument("--benchmark", choices=sorted(BENCHMARKS), help="a registered benchmark")
    source.add_argument("--data", type=Path, help="a .json/.jsonl/.parquet file of cases")
    source.add_argument("--scorer", choices=SCORERS, help="scorer (default: the benchmark's)")
    source.add_argument("--limit", type=int, help="evaluate only the first N cases")
    parser.add_argument("--judge", help="model for an LLM judge instead of the rule scorer")
    parser.add_argument("--out", type=Path, help="output folder (default: runs/eval-NAME)")
    parser.add_argument("--concurrency", type=int, default=2, help="cases in flight (2)")
    add_flow_options(parser)


def eval_command(args: argparse.Namespace) -> int:
    """Evaluate and report."""
    from flowlearn.evals.harness import run_eval
    from flowlearn.evals.reports import write_reports

    if args.concurrency < 1:
        raise UsageError(f"--concurrency must be >= 1, got {args.concurrency}")
    name, cases, scorer, bench = load_cases_and_scorer(args)
    flow = build_flow(args)
    out = args.out or Path("runs") / f"eval-{name}"
    results = run_eval(
        flow.graph,
        cases,
        scorer,
        concurrency=args.concurrency,
        results_path=out / "results.jsonl",
        context=flow.context,
    )
    summary = write_reports(
        results,
        out,
        benchmark=name,
        paper=bench.paper if bench else None,
        paper_untrained=bench.paper_untrained if bench else None,
    )
    low, high = summary["accuracy_ci95"]
    print(
        f"{name}: accuracy {summary['accuracy']:.1f}% (95% CI {low:.1f} to {high:.1f}) over "
        f"{summary['cases']} cases, {summary['mean_turns']:.2f} turns per case"
    )
    print(f"reports: {out / 'report.json'}, {out / 'report.md'}, {out / 'report.png'}")
    return 0


def load_cases_and_scorer(args: argparse.Namespace) -> tuple[str, list[Any], Any, Any]:
    """Resolve --benchmark/--data, --limit, --scorer and --judge into cases and a scorer.

    Returns the name, the cases, a `(answer, case) -> Score` scorer and the Benchmark (or None).
    """
    from flowlearn.evals.benchmarks import BENCHMARKS, load_benchmark, score_case
    from flowlearn.evals.cases import load_cases

    if (args.benchmark is None) == (args.data is None):
        raise UsageError("give exactly one of --benchmark NAME or --data PATH")
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be >= 1, got {args.limit}")
    bench = BENCHMARKS.get(args.benchmark) if args.benchmark else None
    judge = getattr(args, "judge", None)
    scorer_name = args.scorer or (bench.scorer if bench else None)
    if scorer_name is None and judge is None:
        raise UsageError("--data needs --scorer (or --judge) to know how to score answers")
    try:
        cases = (
            load_benchmark(args.benchmark, limit=args.limit)
            if bench
            else load_cases(args.data, limit=args.limit)
        )
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(str(exc)) from exc
    if judge:
        scorer = _judge_scorer(judge, args.device)
    else:

        def scorer(answer: str, case: Any) -> Any:
            return score_case(str(scorer_name), answer, case)

    return args.benchmark or args.data.stem, cases, scorer, bench


def _judge_scorer(model: str, device: str | None) -> Any:
    from flowlearn.evals.scorers import llm_judge
    from flowlearn.nodes.hf_chat import HFChatModel
    from flowlearn.nodes.hf_policy import HFPolicy

    judge = HFChatModel(policy=HFPolicy.from_pretrained(model, device=device), max_new_tokens=256)
    return lambda answer, case: llm_judge(answer, case.reference, judge=judge, question=case.query)
