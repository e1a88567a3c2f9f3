"""`flowlearn run "QUESTION"`: answer one question, printing each turn as it happens."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from flowlearn.errors import UsageError
from flowlearn.files import JsonlFile
from flowlearn.flow_setup import add_flow_options, build_cli_flow, context_from_args
from flowlearn.nodes.schema import InputState
from flowlearn.outputs import claim_store

if TYPE_CHECKING:  # the flow's modules load with the flow, after the options have parsed
    from langchain_core.runnables import RunnableConfig

    from flowlearn.compose import Flow


def add_parser(commands: Any) -> None:
    """Register the `run` subcommand."""
    run = commands.add_parser(
        "run",
        help="answer a question with the AgentFlow flow",
        description="Answer a question with planner -> executor -> verifier -> generator, "
        "printing each turn as it happens. Runs offline on the embedded SmolLM2-135M-Instruct "
        "unless --planner/--engine (or $FLOWLEARN_PLANNER/$FLOWLEARN_ENGINE) name other models.",
    )
    run.add_argument("question", nargs="?", help="the question to answer")
    run.add_argument(
        "--save",
        type=Path,
        help="append the run's trajectory to this .jsonl file (a new one, or one flowlearn run "
        "saved to: a file of yours is never appended to)",
    )
    durable = run.add_argument_group("durable runs (SQLite checkpoints)")
    durable.add_argument("--thread", help="checkpoint the run under this thread id")
    durable.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted run of --thread (no question needed)",
    )
    durable.add_argument(
        "--checkpoints",
        type=Path,
        default=Path("runs/checkpoints.sqlite"),
        help="SQLite checkpoint file (runs/checkpoints.sqlite)",
    )
    # Greedy unless asked, as `eval`: the shipped planner's choice is surest greedy (README,
    # "The planner's turn"); `--temperature 0.7` samples as AgentFlow does at inference.
    add_flow_options(run)


def run_command(args: argparse.Namespace) -> int:
    """Build the flow on local models and answer one question, streaming its turns."""
    if args.save is not None and args.save.suffix != ".jsonl":
        raise UsageError(f"--save {args.save} must be a .jsonl file path")
    if args.resume and not args.thread:
        raise UsageError("--resume needs --thread ID (the run to continue)")
    if args.question is not None:  # on its length alone, before anything tokenises it
        try:
            context_from_args(args).check_question(args.question)
        except ValueError as exc:
            if args.question.strip():  # an empty one is told below, with an example
                raise UsageError(str(exc)) from None
    if args.question is not None and not is_utf8(args.question):
        raise UsageError(
            "the question is not UTF-8 text (the terminal passed undecodable bytes); "
            "give it as UTF-8"
        )
    if args.question is not None and not args.question.strip():
        raise UsageError('the question is empty; give one, e.g. flowlearn run "What is 2 + 2?"')
    if args.resume == bool(args.question):
        raise UsageError("give a question, or --resume --thread ID without one")
    if args.save is not None:  # appended to only when it is a store of flowlearn run's
        claim_store(args.save, "run", flag="--save")
    if args.thread is None:
        return answer(args, build_cli_flow(args), None, None)
    from langgraph.checkpoint.sqlite import SqliteSaver

    check_checkpoints_file(args.checkpoints)
    args.checkpoints.parent.mkdir(parents=True, exist_ok=True)
    with SqliteSaver.from_conn_string(str(args.checkpoints)) as saver:
        config: RunnableConfig = {"configurable": {"thread_id": args.thread}}
        started = saver.get_tuple(config) is not None
        if args.resume and not started:
            raise UsageError(f"thread {args.thread!r} has no run in {args.checkpoints} to resume")
        if not args.resume and started:
            raise UsageError(
                f"thread {args.thread!r} already has a run in {args.checkpoints}; "
                "add --resume to continue it, or use another --thread"
            )
        return answer(args, build_cli_flow(args, checkpointer=saver), saver, config)


CHECKPOINT_TABLES = frozenset({"checkpoints", "writes"})
"""The tables LangGraph's `SqliteSaver` keeps; a `--checkpoints` file holding others is a user's."""


def check_checkpoints_file(path: Path) -> None:
    """Refuse a `--checkpoints` file that is not a SQLite database, or is one of other tables.

    `SqliteSaver` would add its tables to any database it is given, a user's own included.

    Raises:
        UsageError: naming the file, what is in it, and the fix.

    """
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return
    fix = "give a file of its own, e.g. --checkpoints runs/checkpoints.sqlite"
    if not path.is_file():
        raise UsageError(f"--checkpoints {path} is not a file; {fix}")
    try:
        with contextlib.closing(
            sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        ) as db:
            rows = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.DatabaseError as exc:
        raise UsageError(f"--checkpoints {path} is not a SQLite database ({exc}); {fix}") from None
    other = sorted({str(name) for (name,) in rows} - CHECKPOINT_TABLES)
    if other:
        shown = ", ".join(other[:5]) + (f" and {len(other) - 5} more" if len(other) > 5 else "")
        raise UsageError(
            f"--checkpoints {path} is a database with tables of its own ({shown}); flowlearn "
            f"would add its checkpoint tables to it: {fix} (nothing in it was changed)"
        )


def answer(args: argparse.Namespace, flow: Flow, saver: Any, config: RunnableConfig | None) -> int:
    """Stream the run (new, or resumed from its checkpoint) and print the answer."""
    from flowlearn.engine.protocol import ServedPolicy

    planner = str(getattr(flow.planner, "version", type(flow.planner).__name__))
    if isinstance(flow.planner, ServedPolicy):  # say where its prompts are rendered
        where = "here" if flow.planner.tokenizer is not None else "by the server"
        planner += f" at {flow.planner.url} (prompts rendered {where})"
    engine = flow.engine.policy.version
    if isinstance(flow.engine.policy, ServedPolicy):
        engine += f" at {flow.engine.policy.url}"
    print(f"planner: {planner}  engine: {engine}  tools: {', '.join(flow.tool_names)}")
    print(flow.settings())
    state: dict[str, Any] = {"question": args.question}
    start = time.perf_counter()
    inputs: InputState | None = None if args.resume else {"question": args.question}
    if args.resume and config is not None:
        turn = flow.graph.get_state(config).values.get("turn", 0)
        print(f"resuming thread {args.thread} after turn {turn}")
    stream = flow.graph.stream(
        inputs, config, context=flow.context, stream_mode=["updates", "values"]
    )
    for mode, payload in cast(Iterator[tuple[str, Any]], stream):
        if mode == "values":
            state = payload
        else:
            for node, update in payload.items():
                print_update(node, update or {})
    print(f"\nAnswer: {printable(str(state.get('answer', '')))}")
    print(
        f"({state.get('termination')}, {state.get('turn', 0)} turns, "
        f"{time.perf_counter() - start:.1f} s)"
    )
    if args.save is not None:
        save_run(args.save, state, flow.context.to_dict())
        print(f"trajectory appended to {args.save}")
    return 0


def print_update(node: str, update: dict[str, Any]) -> None:
    """Print one node's update as a short line or two."""
    if node == "planner":
        if update.get("analysis"):
            print(f"[analysis] {_short(update['analysis'], 300)}")
        plan = update.get("plan")
        if plan:
            print(f"[turn {plan['turn']}] planner: {_short(plan['sub_goal'])} -> {plan['tool']}")
        elif update.get("termination") == "engine_error" and update.get("memory"):
            record = update["memory"][0]  # the policy call failed: say why, whole
            print(f"[turn {record['turn']}] planner: {_short(str(record.get('error')), 600)}")
        elif update.get("termination"):
            print(f"[budget] {update['termination']} reached")
        elif update.get("memory"):
            record = update["memory"][0]
            error = _short(str(record.get("error")))
            print(f"[turn {record['turn']}] planner: format error ({error})")
    elif node == "executor":
        record = update["memory"][0]
        outcome = f"error: {record['error']}" if record.get("error") else record.get("result")
        args = json.dumps(record.get("arguments"), ensure_ascii=False)
        print(
            f"[turn {record['turn']}] {record['tool']}({_short(args, 120)}) -> "
            f"{_short(str(outcome))}"
        )
    elif node == "verifier":
        print(f"[turn {update['memory'][0]['turn']}] verifier: {update.get('verdict')}")


def save_run(path: Path, state: dict[str, Any], context: dict[str, Any]) -> None:
    """Append one run as a JSON line, durably (a torn line from a crash is repaired first)."""
    JsonlFile(path).append({"context": context, **state})


_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, screen clears
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"  # OSC: window titles, hyperlinks, clipboard
    r"|\x1b[PX^_][^\x1b]*(?:\x1b\\)?"  # DCS, SOS, PM, APC strings
    r"|\x1b.?"  # any other escape
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]"  # other C0 and C1 controls (tabs, newlines stay)
)


def printable(text: str) -> str:
    """Drop terminal control sequences: tool text and model output must not drive the terminal."""
    return _ESCAPES.sub("", text)


def is_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8 (argv bytes that were not decode to lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _short(text: str, limit: int = 160) -> str:
    flat = " ".join(printable(str(text)).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
