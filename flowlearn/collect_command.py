"""`flowlearn collect`: run G rollouts per question and store rewarded trajectories."""

from __future__ import annotations

import argparse
import math
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
from flowlearn.nodes.schema import token_faithful
from flowlearn.outputs import claim_store

MAX_GROUP_SIZE = 1024
"""The most rollouts per question `--group-size` takes (the paper samples 8)."""


def add_parser(commands: Any) -> None:
    """Register the `collect` subcommand."""
    parser = commands.add_parser(
        "collect",
        help="collect G rewarded rollouts per question for Flow-GRPO",
        description="Run --group-size rollouts of every question through the flow, reward "
        "each with the benchmark's scorer, and append them to a JSONL store (resumable: "
        "rerunning completes only the missing rollouts).",
    )
    source = parser.add_argument_group("data")
    source.add_argument("--benchmark", choices=sorted(BENCHMARKS), help="a registered benchmark")
    source.add_argument("--data", type=Path, help="a .json/.jsonl/.parquet file of cases")
    source.add_argument(
        "--scorer", choices=sorted(SCORERS), help="scorer (default: the benchmark's)"
    )
    source.add_argument("--limit", type=int, help="use only the first N questions")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per question (8)")
    parser.add_argument("--out", type=Path, required=True, help="trajectory store (.jsonl)")
    parser.add_argument("--concurrency", type=int, default=4, help="rollouts in flight (4)")
    parser.add_argument(
        "--reward-errors",
        choices=["zero", "drop"],
        default="zero",
        help="a rollout whose scorer failed counts with reward 0 (zero) or is left out of the "
        "returned set (drop); it is stored and marked either way",
    )
    parser.add_argument(
        "--format-penalty",
        type=float,
        default=0.0,
        help="subtract this times the share of unparseable planner turns",
    )
    # rollouts to train on need variety: sampled, not greedy as a run (the paper's 3 turns),
    # with training's defaults, declared once
    from flowlearn.nodes.schema.context import TRAINING_CONTEXT as rollouts

    add_flow_options(parser, defaults=rollouts)


def collect_command(args: argparse.Namespace) -> int:
    """Collect and store."""
    # the flow's modules (LangGraph, LangChain) load after the options have parsed
    from flowlearn.compose import build_flow, load_work, run_settings
    from flowlearn.training.rollouts import collect, format_penalty
    from flowlearn.training.trajectories import TrajectoryStore

    if not 1 <= args.group_size <= MAX_GROUP_SIZE:
        raise UsageError(f"--group-size must be in [1, {MAX_GROUP_SIZE}], got {args.group_size}")
    if not math.isfinite(args.format_penalty) or args.format_penalty < 0:
        raise UsageError(
            f"--format-penalty must be a finite number >= 0, got {args.format_penalty}"
        )
    check_concurrency(args.concurrency)
    check_limit(args.limit)
    if args.out.suffix != ".jsonl":
        raise UsageError(f"--out {args.out} must be a .jsonl file")
    spec = spec_from_args(args)
    name, cases, scorer, _ = load_work(
        spec, benchmark=args.benchmark, data=args.data, scorer=args.scorer, limit=args.limit
    )
    context = context_from_args(args)
    check_questions(cases, context)  # before any model loads
    settings = run_settings(
        spec,
        context,
        benchmark=args.benchmark,
        data=args.data,
        scorer=args.scorer,
        limit=args.limit,
    )
    settings["format_penalty"] = args.format_penalty  # part of every stored reward
    # appended only when made with these settings; more questions or more rollouts per
    # question only add to it
    claim_store(args.out, "collect", settings, free_to_change=("limit",))
    flow = build_flow(spec, context)
    print(flow.settings())
    extra = {"format_penalty": format_penalty(args.format_penalty)} if args.format_penalty else {}
    trajectories = collect(
        flow.graph,
        cases,
        scorer,
        group_size=args.group_size,
        store=TrajectoryStore(args.out),
        concurrency=args.concurrency,
        context=flow.context,
        extra_rewards=extra,
        reward_errors=args.reward_errors,
    )
    faithful = sum(
        all(token_faithful(t) for t in x.transitions if t["node"] == "planner")
        for x in trajectories
    )
    mean = sum(t.total_reward for t in trajectories) / max(len(trajectories), 1)
    print(
        f"{name}: {len(trajectories)} trajectories in {args.out} "
        f"({len(cases)} questions x {args.group_size}); mean reward {mean:.3f}; "
        f"{faithful} with token ids on every planner turn"
    )
    return 0
