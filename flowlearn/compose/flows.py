"""Build a flow from its names: the tools, the graph, the work, the settings a run records."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph

from flowlearn.compose.models import load_chat_model, load_parts
from flowlearn.compose.names import FlowSpec, check_names
from flowlearn.engine import (
    BASE_SOURCE,
    HFChatModel,
    ModelNotFoundError,
    Policy,
    untrained_twin,
)
from flowlearn.engine.adapters import by_node
from flowlearn.engine.loading import parameter_count
from flowlearn.errors import UsageError
from flowlearn.evals.benchmarks import BENCHMARKS, Benchmark
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import CaseScorer
from flowlearn.evals.tasks import load_cases_and_scorer
from flowlearn.graphs import InputState, State, build_agentflow
from flowlearn.graphs.agentflow import TRAINABLE_NODES
from flowlearn.nodes.prompts import (
    AGENTFLOW_PROMPTS,
    Prompts,
    runs_analysis,
)
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.tools import default_tools

if TYPE_CHECKING:
    pass


def build_tools(
    spec: FlowSpec, engine: BaseChatModel, prompts: Prompts | None = None
) -> list[BaseTool]:
    """Return the tools the spec binds over the fixed engine, ordered and sized by `prompts`."""
    prompts = prompts or spec.prompt_set()
    tools = default_tools(
        engine,
        corpus=spec.corpus,
        web=spec.web,
        wikipedia_endpoint=spec.wikipedia_endpoint,
        python_isolation=spec.python_isolation,
        k=prompts.search_k,
        order=prompts.tool_order,
    )
    return [tool for tool in tools if spec.python or tool.name != "python"]


@dataclass
class Flow:
    """A compiled graph with what it was built from."""

    graph: CompiledStateGraph[State, Context, InputState, Any]
    context: Context
    planner: Policy
    engine: HFChatModel
    tool_names: list[str]
    prompts: Prompts = AGENTFLOW_PROMPTS
    engine_note: str = "the planner's model, untrained"
    """Why the engine is the one it is (named, recorded by training, or the default)."""
    trained_nodes: tuple[str, ...] = ()
    """The nodes that run on adapters of their own (a training result of several nodes)."""

    def settings(self) -> str:
        """Return one line naming the settings a run of this flow uses."""
        context = self.context
        analysis = "on" if runs_analysis(context, self.prompts) else "off"
        nodes = f"  adapters: {', '.join(self.trained_nodes)}" if self.trained_nodes else ""
        return (
            f"prompts: {self.prompts.name}  query analysis: {analysis}  "
            f"temperature: {context.planner_temperature:g}  max turns: {context.max_turns}  "
            f"engine: {self.engine_note}{nodes}"
        )


def build_flow(
    spec: FlowSpec,
    context: Context | None = None,
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    output_schema: type[Any] = State,
) -> Flow:
    """Check the names, load the models and compile the flow.

    `output_schema`: see `build_agentflow`; the LangGraph server's graph gives `OutputState`.

    Raises:
        UsageError: a bad name or a missing model, with how to fix it.

    """
    context = context or Context()
    engine_name, why = spec.engine_choice()
    spec = dataclasses.replace(spec, engine=engine_name)
    check_names(spec, tools=context.tools)
    prompts = spec.prompt_set()
    try:
        loaded, engine = load_parts(spec, prompts)
    except (ValueError, ModelNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    tools = build_tools(spec, engine, prompts)
    nodes = by_node(loaded)  # a training result of several nodes, or the one planner
    planner: Policy = nodes.for_node("planner")
    unused = sorted(set(nodes.trained) - set(TRAINABLE_NODES))
    if unused:
        raise UsageError(
            f"{spec.planner} holds adapters for {unused}, nodes the AgentFlow graph does "
            "not have; load it in your own graph (flowlearn.engine.adapters)"
        )
    graph = build_agentflow(
        planner,
        engine,
        tools,
        prompts=prompts,
        checkpointer=checkpointer,
        output_schema=output_schema,
        verifier_policy=nodes.trained.get("verifier"),
        executor_policy=nodes.trained.get("executor"),
    )
    names = sorted(context.tools or [tool.name for tool in tools])
    flow = Flow(graph, context, planner, engine, names, prompts, engine_note=why)
    flow.trained_nodes = tuple(nodes.trained)
    return flow


def load_work(
    spec: FlowSpec,
    *,
    benchmark: str | None,
    data: str | Path | None,
    scorer: str | None,
    limit: int | None,
    judge: str | None = None,
) -> tuple[str, list[Case], CaseScorer, Benchmark | None]:
    """Resolve a benchmark or data file, a limit and a scorer (or a judge model) into work.

    The one resolution `eval`, `collect` and training share. Returns the work's name, its
    cases, their scorer and the registered `Benchmark` (None for a data file).

    Raises:
        UsageError: bad options or an unreadable data file, saying which.

    """
    try:
        cases, score = load_cases_and_scorer(
            benchmark=benchmark,
            data=data,
            scorer=scorer,
            limit=limit,
            judge=partial(load_chat_model, judge, spec) if judge else None,
            data_dir=spec.benchmarks_dir,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    name = benchmark or Path(str(data)).stem
    return name, cases, score, BENCHMARKS.get(benchmark or "")


def run_settings(
    spec: FlowSpec,
    context: Context,
    *,
    benchmark: str | None,
    data: str | Path | None,
    scorer: str | None,
    limit: int | None,
    judge: str | None = None,
) -> dict[str, Any]:
    """Return the settings a run's results depend on, as eval and collect record them.

    Computed from the names alone, before any model loads, so a rerun into another run's
    output is refused at once (`flowlearn.outputs`). The data is the benchmark's name or the
    file's SHA-256, so an edited file counts as other data.
    """
    if data is not None:
        try:
            digest = hashlib.sha256(Path(data).read_bytes()).hexdigest()[:16]
        except OSError as exc:
            raise UsageError(f"--data {data}: {exc.strerror or exc}") from None
        source = f"file {Path(data).name} sha256:{digest}"
    else:
        source = f"benchmark {benchmark}"
    bench = BENCHMARKS.get(benchmark or "")
    prompts = spec.prompt_set()
    engine = spec.engine_choice()[0]
    return {
        "data": source,
        "limit": limit,
        "scorer": f"judge {judge}" if judge else scorer or (bench.scorer if bench else None),
        "planner": f"{spec.planner} at {spec.planner_url}" if spec.planner_url else spec.planner,
        "engine": f"{engine} at {spec.engine_url}" if spec.engine_url else engine,
        "engine_max_new_tokens": spec.engine_max_new_tokens,
        "prompts": prompts.name,
        "query_analysis": runs_analysis(context, prompts),
        "tools": sorted(context.tools or spec.bound_tools()),
        "corpus": spec.corpus,
        "max_turns": context.max_turns,
        "max_seconds": context.max_seconds,
        **{key: value for key, value in context.planner_sampling().as_dict().items()},
    }


def model_sizes(spec: FlowSpec) -> dict[str, int | None]:
    """Return the parameter counts of the planner and the engine `load_parts` loads.

    Read from the models' configs (no weights load), for a report to say how large the
    models it names are. A served model, or one whose config does not say, is None: a size
    is a label, never a reason for an eval whose models loaded to fail.
    """
    engine = spec.engine_choice()[0]
    sources = {
        "planner": None if spec.planner_url else spec.planner,
        "engine": None
        if spec.engine_url
        else engine or (BASE_SOURCE if spec.planner_url else untrained_twin(spec.planner)),
    }
    sizes: dict[str, int | None] = {}
    for role, source in sources.items():
        try:
            sizes[role] = parameter_count(source, spec.cache_dir) if source else None
        except (ModelNotFoundError, OSError, ValueError):
            sizes[role] = None
    return sizes
