"""The `flowlearn` command line: `flowlearn run "QUESTION"` answers a question with the flow."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, cast


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="flowlearn", description="Agent workflows that learn from their own runs."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser(
        "run",
        help="answer a question with the AgentFlow flow",
        description="Answer a question with planner -> executor -> verifier -> generator, "
        "printing each step as it happens. Runs offline on the embedded SmolLM2-135M-Instruct "
        "unless --planner/--engine (or $FLOWLEARN_PLANNER/$FLOWLEARN_ENGINE) name other models.",
    )
    run.add_argument("question", help="the question to answer")
    run.add_argument("--planner", help="planner model: hub id, local folder or .gguf file")
    run.add_argument("--engine", help="fixed engine model (default: the planner's model)")
    run.add_argument("--max-steps", type=int, default=10, help="planner turns allowed (10)")
    run.add_argument("--max-seconds", type=float, help="wall-clock budget in seconds")
    run.add_argument("--temperature", type=float, default=0.7, help="planner temperature (0.7)")
    run.add_argument("--top-p", type=float, default=1.0, help="planner top-p (1.0)")
    run.add_argument("--max-new-tokens", type=int, default=256, help="planner tokens per turn")
    run.add_argument(
        "--engine-max-new-tokens", type=int, default=384, help="engine tokens per call (384)"
    )
    run.add_argument("--tools", help="comma-separated tool names to enable (default: all)")
    run.add_argument("--corpus", help="JSONL corpus for the local_search tool ($FLOWLEARN_CORPUS)")
    run.add_argument(
        "--web",
        action="store_true",
        help="add wikipedia_search and web_search (needs TAVILY_API_KEY)",
    )
    run.add_argument("--seed", type=int, help="seed for the planner's sampling")
    run.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: CUDA when available)")
    run.add_argument("--dtype", help="float32, bfloat16, ... (default: bf16 on CUDA, else fp32)")
    run.add_argument("--save", type=Path, help="append the run's trajectory to this JSONL file")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return run_command(args)
    raise AssertionError(f"unhandled command {args.command}")  # argparse rejects the rest


def run_command(args: argparse.Namespace) -> int:
    """Build the flow on local models and answer one question, streaming its steps."""
    from flowlearn.graphs import Context, build_agentflow
    from flowlearn.nodes.hf_loading import ModelNotFoundError
    from flowlearn.nodes.local_models import load_local_models
    from flowlearn.nodes.tools import default_tools

    try:
        context = Context(
            max_steps=args.max_steps,
            max_seconds=args.max_seconds,
            planner_temperature=args.temperature,
            planner_top_p=args.top_p,
            planner_max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            tools=tuple(t.strip() for t in args.tools.split(",")) if args.tools else None,
        )
        if args.save is not None and args.save.is_dir():
            raise ValueError(f"--save {args.save} is a folder; give a .jsonl file path")
        if args.corpus is not None and not Path(args.corpus).is_file():
            raise ValueError(f"--corpus {args.corpus} is not a file; give a JSONL corpus")
        models = load_local_models(
            args.planner,
            args.engine,
            device=args.device,
            dtype=args.dtype,
            engine_max_new_tokens=args.engine_max_new_tokens,
        )
    except (ValueError, ModelNotFoundError) as exc:
        print(f"flowlearn run: error: {exc}", file=sys.stderr)
        return 2
    try:
        tools = default_tools(models.engine, corpus=args.corpus, web=args.web or None)
    except ValueError as exc:
        print(f"flowlearn run: error: {exc}", file=sys.stderr)
        return 2
    names = {tool.name for tool in tools}
    unknown = sorted(set(context.tools or ()) - names)
    if unknown:
        print(
            f"flowlearn run: error: unknown tools {unknown}; available: {sorted(names)}",
            file=sys.stderr,
        )
        return 2
    graph = build_agentflow(models.planner, models.engine, tools)
    print(
        f"planner: {models.planner.version}  engine: {models.engine.policy.version}  "
        f"tools: {', '.join(sorted(context.tools or names))}"
    )
    state: dict[str, Any] = {"question": args.question}
    start = time.perf_counter()
    stream = graph.stream(
        {"question": args.question}, context=context, stream_mode=["updates", "values"]
    )
    for mode, payload in cast(Iterator[tuple[str, Any]], stream):
        if mode == "values":
            state = payload
        else:
            for node, update in payload.items():
                print_update(node, update or {})
    print(f"\nAnswer: {state.get('answer', '')}")
    print(
        f"({state.get('termination')}, {state.get('step', 0)} steps, "
        f"{time.perf_counter() - start:.1f} s)"
    )
    if args.save is not None:
        save_run(args.save, state, context.to_dict())
        print(f"trajectory appended to {args.save}")
    return 0


def print_update(node: str, update: dict[str, Any]) -> None:
    """Print one node's update as a short line or two."""
    if node == "planner":
        if update.get("analysis"):
            print(f"[analysis] {_short(update['analysis'], 300)}")
        plan = update.get("plan")
        if plan:
            print(f"[step {plan['step']}] planner: {_short(plan['sub_goal'])} -> {plan['tool']}")
        elif update.get("termination"):
            print(f"[budget] {update['termination']} reached")
        elif update.get("memory"):
            record = update["memory"][0]
            print(f"[step {record['step']}] planner: format error ({record.get('error')})")
    elif node == "executor":
        record = update["memory"][0]
        outcome = f"error: {record['error']}" if record.get("error") else record.get("result")
        args = json.dumps(record.get("arguments"), ensure_ascii=False)
        print(
            f"[step {record['step']}] {record['tool']}({_short(args, 120)}) -> "
            f"{_short(str(outcome))}"
        )
    elif node == "verifier":
        print(f"[step {update['memory'][0]['step']}] verifier: {update.get('verdict')}")


def save_run(path: Path, state: dict[str, Any], context: dict[str, Any]) -> None:
    """Append one run as a JSON line and flush it to disk."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"context": context, **state}
    with path.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        handle.flush()


def _short(text: str, limit: int = 160) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
