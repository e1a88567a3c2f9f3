"""`flowlearn eval --benchmark NAME`: run a benchmark through the flow and write reports."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flowlearn.errors import UsageError
from flowlearn.evals.benchmarks import BENCHMARKS
from flowlearn.evals.scorers import SCORERS
from flowlearn.flow_setup import (
    add_flow_options,
    check_concurrency,
    check_limit,
    check_questions,
    context_from_args,
    spec_from_args,
)
from flowlearn.outputs import claim_folder, claim_store


def add_parser(commands: Any) -> None:
    """Register the `eval` subcommand."""
    parser = commands.add_parser(
        "eval",
        help="evaluate the flow on a benchmark",
        description="Run a benchmark's cases through the flow (resumable), score the answers "
        "and write report.json, report.md and report.png.",
    )
    source = parser.add_argument_group("data")
    source.add_argument("--benchmark", choices=sorted(BENCHMARKS), help="a registered benchmark")
    source.add_argument("--data", type=Path, help="a .json/.jsonl/.parquet file of cases")
    source.add_argument(
        "--scorer", choices=sorted(SCORERS), help="scorer (default: the benchmark's)"
    )
    source.add_argument("--limit", type=int, help="evaluate only the first N cases")
    parser.add_argument("--judge", help="model for an LLM judge instead of the rule scorer")
    parser.add_argument("--out", type=Path, help="output folder (default: runs/eval-NAME)")
    parser.add_argument("--concurrency", type=int, default=2, help="cases in flight (2)")
    parser.add_argument(
        "--save",
        type=Path,
        help="append each case's final state (memory, answer, transitions) to this JSONL file",
    )
    # Greedy unless asked: the same planner on the same cases scores the same (sampled at
    # T=0.7, as AgentFlow's test/solve.py does, the shipped planner scored 68.8-75.0% on the
    # 48 held-out cases over four runs, README "Evaluating"); `--temperature 0.7` samples.
    add_flow_options(parser)


def eval_command(args: argparse.Namespace) -> int:
    """Evaluate and report."""
    # the flow's modules (LangGraph, LangChain) load after the options have parsed
    from flowlearn.compose import build_flow, load_work, model_sizes, run_settings
    from flowlearn.evals.harness import run_eval
    from flowlearn.evals.reports import write_reports

    check_concurrency(args.concurrency)
    check_limit(args.limit)
    if args.save is not None and args.save.is_dir():
        raise UsageError(f"--save {args.save} is a folder; give a .jsonl file path")
    if args.save is not None and args.save.suffix != ".jsonl":
        raise UsageError(f"--save {args.save} must be a .jsonl file path")
    spec = spec_from_args(args)
    name, cases, scorer, bench = load_work(
        spec,
        benchmark=args.benchmark,
        data=args.data,
        scorer=args.scorer,
        limit=args.limit,
        judge=args.judge,
    )
    context = context_from_args(args)
    check_questions(cases, context)  # before any model loads
    out = args.out or Path("runs") / f"eval-{name}"
    # results are reused only under the settings that made them; a new --limit only
    # changes which cases run
    settings = run_settings(
        spec,
        context,
        benchmark=args.benchmark,
        data=args.data,
        scorer=args.scorer,
        limit=args.limit,
        judge=args.judge,
    )
    marker = claim_folder(out, "eval", settings, free_to_change=("limit",))
    if args.save is not None:  # appended to only when it is a store of flowlearn eval's
        claim_store(args.save, "eval", flag="--save")
    flow = build_flow(spec, context)
    print(flow.settings())
    results = run_eval(
        flow.graph,
        cases,
        scorer,
        concurrency=args.concurrency,
        results_path=out / "results.jsonl",
        context=flow.context,
        states_path=args.save,
    )
    summary = write_reports(
        results,
        out,
        benchmark=name,
        paper=bench.paper if bench else None,
        paper_untrained=bench.paper_untrained if bench else None,
        settings=marker["settings"] if marker else settings,  # as the folder records them
        settings_line=flow.settings(),
        parameters=model_sizes(spec),
    )
    low, high = summary["accuracy_ci95"]
    print(
        f"{name}: accuracy {summary['accuracy']:.1f}% (95% CI {low:.1f} to {high:.1f}) over "
        f"{summary['cases']} cases, {summary['mean_turns']:.2f} turns per case"
    )
    print(f"reports: {out / 'report.json'}, {out / 'report.md'}, {out / 'report.png'}")
    return 0
