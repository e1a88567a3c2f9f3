"""`flowlearn serve`: serve a training result on vLLM, one LoRA adapter per trained node."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path
from typing import Any

from flowlearn.errors import SetupError


def add_parser(commands: Any) -> None:
    """Register the `serve` subcommand."""
    parser = commands.add_parser(
        "serve",
        help="serve a training result on vLLM, an adapter per trained node",
        description="Start `vllm serve BASE --enable-lora --lora-modules node=path ...` for a "
        "training result: the base it was trained on, each trained node's adapter served under "
        "the node's name. Your app then calls it with flowlearn.load_trained(FOLDER, "
        "server_url=...). Nothing but the result's record is read here.",
    )
    parser.add_argument("folder", type=Path, help="the training result (its final/ folder)")
    parser.add_argument("--port", type=int, help="the server's port (vLLM's default: 8000)")
    parser.add_argument(
        "--print",
        action="store_true",
        dest="print_only",
        help="print the command instead of running it (to run it on the serving machine)",
    )
    parser.add_argument("--verbose", action="store_true", help="show an error's traceback")


def serve_command(args: argparse.Namespace) -> int:
    """Print the result's `vllm serve` command, or replace this process with it.

    Raises:
        UsageError: a folder that is not a result, or a base vLLM cannot serve.
        SetupError: vLLM is not installed here (the message holds the command to run).

    """
    from flowlearn.compose.trained import read_result

    trained = read_result(args.folder)
    command = trained.serve_command(port=args.port)
    line = trained.serve_command_line(port=args.port)
    if args.print_only:
        print(line)
        return 0
    found = shutil.which("vllm")
    if found is None:
        raise SetupError(
            f"vllm is not installed here (pip install vllm, on a machine with a GPU); run "
            f"there: {line}"
        )
    print(line, flush=True)
    os.execv(found, command)  # the server is the process from here on (its signals, its exit)
    return 0  # pragma: no cover: execv does not return
