"""Command-line options shared by `run`, `eval` and `collect`, and the flow they build.

The run-scoped flags come from `Context`'s own fields (defaults and help text included), so a
setting has one declaration; the model and tool flags name a `FlowSpec` for the composition
root (`flowlearn.compose`), which reads the environment for what the flags leave unset. The
options are built from the schema and the prompt sets alone; the composition root (LangGraph,
LangChain) is imported only once they have parsed, so a mistyped flag is told at once.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Sequence
from dataclasses import MISSING, fields
from typing import TYPE_CHECKING, Any

from flowlearn.errors import UsageError
from flowlearn.evals.cases import Case
from flowlearn.nodes.presets import PROMPT_SETS
from flowlearn.nodes.schema.context import Context

if TYPE_CHECKING:  # the composition root loads LangGraph: imported where a flow is built
    from flowlearn.compose import Flow, FlowSpec

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_LIMIT",
    "Flow",
    "UsageError",
    "add_flow_options",
    "build_cli_flow",
    "check_concurrency",
    "check_limit",
    "check_questions",
    "context_from_args",
    "spec_from_args",
]

CONTEXT_FLAGS = {
    "max_turns": "--max-turns",
    "max_seconds": "--max-seconds",
    "planner_temperature": "--temperature",
    "planner_top_p": "--top-p",
    "planner_max_new_tokens": "--max-new-tokens",
    "seed": "--seed",
    "max_question_chars": "--max-question-chars",
}
"""The `Context` fields the CLI sets, and their flags (`--tools` is parsed as a list)."""


def __getattr__(name: str) -> Any:
    """Import `Flow` on first use: it brings the composition root, and LangGraph with it."""
    if name == "Flow":
        from flowlearn.compose import Flow

        return Flow
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DeprecatedAlias(argparse.Action):
    """Store the value under the new option's name and warn that the old spelling is going."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        """Warn, then store the value as the new option would."""
        new = "--" + str(self.dest).replace("_", "-")
        message = f"{option_string} is deprecated; use {new} (planner turns)"
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        print(f"warning: {message}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_flow_options(
    parser: argparse.ArgumentParser,
    *,
    defaults: Context | None = None,
) -> None:
    """Add the model, run-context and tool options.

    Each context flag defaults to `defaults`' field (None: `Context()`'s, a run's; `flowlearn
    collect` gives `TRAINING_CONTEXT`).
    """
    models = parser.add_argument_group("models")
    models.add_argument(
        "--planner", help="planner model: hub id, local folder or .gguf file ($FLOWLEARN_PLANNER)"
    )
    models.add_argument("--engine", help="fixed engine model (default: the planner's model)")
    models.add_argument(
        "--planner-url",
        help="plan on an OpenAI-compatible server (vLLM) at this base URL, e.g. "
        "http://127.0.0.1:8000/v1; --planner names the served model",
    )
    models.add_argument(
        "--engine-url",
        help="run the fixed engine on an OpenAI-compatible server (vLLM) at this base URL (the "
        "planner's, to serve both from one GPU); --engine names the served model: the local "
        "folder or cached hub id it serves, whose tokenizer loads here ($FLOWLEARN_ENGINE_URL)",
    )
    models.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: CUDA if available)")
    models.add_argument("--dtype", help="float32, bfloat16, ... (default: bf16 on CUDA, else fp32)")
    models.add_argument(
        "--engine-max-new-tokens",
        type=int,
        help="engine tokens for every call (default: each role's own, from the prompt set)",
    )
    models.add_argument(
        "--prompts",
        choices=sorted(PROMPT_SETS),
        help="the prompt set: agentflow (AgentFlow's prompts and query analysis) or smollm2 "
        "(tuned for the embedded 135M model); default: smollm2 when the planner or engine is "
        "the embedded default, else agentflow ($FLOWLEARN_PROMPTS)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show the libraries' loading bars and warnings (transformers, TRL, peft); "
        "flowlearn's own progress and warnings show either way",
    )
    flow = parser.add_argument_group("flow (the run's Context)")
    by_name = {f.name: f for f in fields(Context)}
    for name, flag in CONTEXT_FLAGS.items():
        f = by_name[name]
        default = f.default if f.default is not MISSING else None
        if defaults is not None:
            default = getattr(defaults, name)
        counts = {"max_turns", "planner_max_new_tokens", "seed", "max_question_chars"}
        kind = int if name in counts else float
        help_text = f.metadata["description"] + (f" ({default})" if default is not None else "")
        flow.add_argument(flag, dest=name, type=kind, default=default, help=help_text)
    flow.add_argument(
        "--max-steps", type=int, dest="max_turns", action=DeprecatedAlias, help=argparse.SUPPRESS
    )
    flow.add_argument(
        "--query-analysis",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=by_name["query_analysis"].metadata["description"],
    )
    flow.add_argument("--tools", help="comma-separated tool names to enable (default: all)")
    flow.add_argument("--corpus", help="JSONL corpus for local_search ($FLOWLEARN_CORPUS)")
    flow.add_argument(
        "--web",
        action="store_true",
        default=None,
        help="add wikipedia_search and web_search (TAVILY_API_KEY; $FLOWLEARN_WEB_TOOLS=1)",
    )
    flow.add_argument(
        "--python-isolation",
        choices=["bwrap", "none"],
        help="how the python tool runs model-written code: bwrap (default: the Linux sandbox) "
        "or none (unisolated, with your rights: an explicit opt-in; $FLOWLEARN_PYTHON_ISOLATION)",
    )


MAX_CONCURRENCY = 64
"""The most cases or rollouts in flight at once (`--concurrency`): each is a thread and a flow."""
MAX_LIMIT = 10_000_000
"""The most cases `--limit` may ask for."""


def check_concurrency(value: int) -> None:
    """Refuse a `--concurrency` outside [1, MAX_CONCURRENCY]."""
    if not 1 <= value <= MAX_CONCURRENCY:
        raise UsageError(f"--concurrency must be in [1, {MAX_CONCURRENCY}], got {value}")


def check_limit(value: int | None) -> None:
    """Refuse a `--limit` outside [1, MAX_LIMIT] (None: every case)."""
    if value is not None and not 1 <= value <= MAX_LIMIT:
        raise UsageError(f"--limit must be in [1, {MAX_LIMIT}], got {value}")


def context_from_args(args: argparse.Namespace) -> Context:
    """Build the run's Context from the flags, as a usage error when a value is bad."""
    values = {name: getattr(args, name) for name in CONTEXT_FLAGS}
    # `--tools ""` names no tool: an error (Context says so), not "every tool, python included"
    split = () if args.tools is None else (t.strip() for t in args.tools.split(","))
    values["tools"] = None if args.tools is None else tuple(t for t in split if t)
    values["query_analysis"] = args.query_analysis
    try:
        return Context(**values)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def check_questions(cases: Sequence[Case], context: Context) -> None:
    """Refuse, before any model loads, cases whose question the run would refuse.

    Raises:
        UsageError: naming the first such case, how many there are, and the fix.

    """
    for number, case in enumerate(cases):
        try:
            context.check_question(case.query)
        except ValueError as exc:
            rest = sum(len(c.query) > context.max_question_chars for c in cases[number + 1 :])
            more = f" ({rest} more cases too)" if rest else ""
            raise UsageError(f"case {case.id!r}{more}: {exc}") from None


def spec_from_args(args: argparse.Namespace) -> FlowSpec:
    """Name the flow's parts from the flags; unset ones come from `FLOWLEARN_*` variables."""
    from flowlearn.compose import FlowSpec

    return FlowSpec.from_env(
        planner=args.planner,
        engine=args.engine,
        planner_url=args.planner_url,
        engine_url=args.engine_url,
        device=args.device,
        dtype=args.dtype,
        engine_max_new_tokens=args.engine_max_new_tokens,
        corpus=args.corpus,
        web=args.web,
        python_isolation=getattr(args, "python_isolation", None),
        prompts=getattr(args, "prompts", None),
        batch_size=getattr(args, "concurrency", 1),  # concurrent flows share batches
    )


def build_cli_flow(args: argparse.Namespace, *, checkpointer: Any = None) -> Flow:
    """Check the names, load the models and compile the flow the flags describe.

    Raises:
        UsageError: a bad option value or a missing model, with how to fix it.

    """
    from flowlearn.compose import build_flow

    return build_flow(spec_from_args(args), context_from_args(args), checkpointer=checkpointer)
