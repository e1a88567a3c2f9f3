"""Command-line options shared by `run`, `eval` and `collect`, and the flow they build."""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class UsageError(ValueError):
    """A bad option value; the CLI prints it and exits with status 2."""


class DeprecatedAlias(argparse.Action):
    """Store the value under the new option's name and warn that the old spelling is going."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        """Warn once, then store the value as the new option would."""
        new = "--" + str(self.dest).replace("_", "-")
        warnings.warn(
            f"{option_string} is deprecated; use {new} (planner turns)",
            DeprecationWarning,
            stacklevel=2,
        )
        print(f"warning: {option_string} is deprecated; use {new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_flow_options(parser: argparse.ArgumentParser, *, max_turns: int = 10) -> None:
    """Add the model, sampling, budget and tool options."""
    models = parser.add_argument_group("models")
    models.add_argument("--planner", help="planner model: hub id, local folder or .gguf file")
    models.add_argument("--engine", help="fixed engine model (default: the planner's model)")
    models.add_argument(
        "--planner-url",
        help="plan on an OpenAI-compatible server (vLLM) at this base URL, e.g. "
        "http://127.0.0.1:8000/v1; --planner names the served model (the engine stays local)",
    )
    models.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: CUDA if available)")
    models.add_argument("--dtype", help="float32, bfloat16, ... (default: bf16 on CUDA, else fp32)")
    models.add_argument(
        "--engine-max-new-tokens", type=int, default=384, help="engine tokens per call (384)"
    )
    flow = parser.add_argument_group("flow")
    flow.add_argument(
        "--max-turns", type=int, default=max_turns, help=f"planner turns allowed ({max_turns})"
    )
    flow.add_argument(
        "--max-steps",
        type=int,
        dest="max_turns",
        action=DeprecatedAlias,
        help="deprecated alias of --max-turns",
    )
    flow.add_argument("--max-seconds", type=float, help="wall-clock budget per question")
    flow.add_argument("--temperature", type=float, default=0.7, help="planner temperature (0.7)")
    flow.add_argument("--top-p", type=float, default=1.0, help="planner top-p (1.0)")
    flow.add_argument("--max-new-tokens", type=int, default=256, help="planner tokens per turn")
    flow.add_argument("--seed", type=int, help="seed for the planner's sampling")
    flow.add_argument("--tools", help="comma-separated tool names to enable (default: all)")
    flow.add_argument("--corpus", help="JSONL corpus for local_search ($FLOWLEARN_CORPUS)")
    flow.add_argument(
        "--web", action="store_true", help="add wikipedia_search and web_search (TAVILY_API_KEY)"
    )


@dataclass
class Flow:
    """A compiled graph with what it was built from."""

    graph: Any
    context: Any
    planner: Any
    engine: Any
    tool_names: list[str]


def build_flow(args: argparse.Namespace, *, checkpointer: Any = None) -> Flow:
    """Validate the options, load the local models and compile the flow.

    Raises:
        UsageError: a bad option value or a missing model, with how to fix it.

    """
    from flowlearn.graphs import Context, build_agentflow
    from flowlearn.nodes.hf_loading import ModelNotFoundError
    from flowlearn.nodes.local_models import load_local_models
    from flowlearn.nodes.tools import default_tools

    try:
        context = Context(
            max_turns=args.max_turns,
            max_seconds=args.max_seconds,
            planner_temperature=args.temperature,
            planner_top_p=args.top_p,
            planner_max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            tools=tuple(t.strip() for t in args.tools.split(",")) if args.tools else None,
        )
        if args.corpus is not None and not Path(args.corpus).is_file():
            raise ValueError(f"--corpus {args.corpus} is not a file; give a JSONL corpus")
        if args.planner_url is not None and not args.planner:
            raise ValueError(
                "--planner-url needs --planner: the name the server serves the model under"
            )
        local_planner = None if args.planner_url else args.planner
        models = load_local_models(
            local_planner,
            args.engine,
            device=args.device,
            dtype=args.dtype,
            engine_max_new_tokens=args.engine_max_new_tokens,
            batch_size=getattr(args, "concurrency", 1),  # concurrent flows share batches
        )
        tools = default_tools(models.engine, corpus=args.corpus, web=args.web or None)
        planner = models.planner if args.planner_url is None else server_planner(args)
    except (ValueError, ModelNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    names = [tool.name for tool in tools]
    unknown = sorted(set(context.tools or ()) - set(names))
    if unknown:
        raise UsageError(f"unknown tools {unknown}; available: {sorted(names)}")
    graph = build_agentflow(planner, models.engine, tools, checkpointer=checkpointer)
    return Flow(graph, context, planner, models.engine, sorted(context.tools or names))


def server_planner(args: argparse.Namespace) -> Any:
    """Return the planner on the server at `--planner-url`, serving the `--planner` model.

    When the model's tokenizer loads here (a local folder, or a hub id with hub access), the
    chat template is applied here and prompts go to the server as token ids; otherwise the
    server renders them. Either way the transitions carry the ids the server returns.
    """
    from flowlearn.nodes.server_policy import ServerPolicy

    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.planner)
    except (OSError, ValueError):
        tokenizer = None
    return ServerPolicy(args.planner_url, args.planner, tokenizer=tokenizer)
