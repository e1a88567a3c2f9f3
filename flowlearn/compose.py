"""The composition root: names (flags, YAML, environment, Studio) in, models, tools, graphs out.

It is the one module that reads `FLOWLEARN_*` environment variables, and it checks every name
(tools, models, benchmark, corpus) before any model loads, so a typo fails in a second with a
message that says what to fix, not as every rollout failing. The CLI, the Studio graph and
training all build their parts here: local models, models on an OpenAI-compatible server
(vLLM), the tools, the prompt set and the graph, and a training job's parts. Training's modules
load torch and TRL, so they are imported only by the functions that build a training job.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph.state import CompiledStateGraph

from flowlearn.engine import (
    BASE_SOURCE,
    DEFAULT_SOURCES,
    BatchingPolicy,
    FrozenBasePolicy,
    HFChatModel,
    HFPolicy,
    ModelHandle,
    ModelNotFoundError,
    Policy,
    ServerChatModel,
    ServerPolicy,
    untrained_twin,
)
from flowlearn.errors import UsageError
from flowlearn.evals.benchmarks import BENCHMARKS, Benchmark
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import CaseScorer
from flowlearn.evals.tasks import load_cases_and_scorer
from flowlearn.graphs import InputState, State, build_agentflow
from flowlearn.nodes.prompts import (
    AGENTFLOW_PROMPTS,
    Budgets,
    Prompts,
    recorded_prompts,
    runs_analysis,
)
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools import BASE_TOOLS, WEB_TOOLS, Isolation, default_tools
from flowlearn.nodes.tools.local_search import load_index
from flowlearn.nodes.tools.python_sandbox import ISOLATIONS
from flowlearn.nodes.tools.web_search import KEY_ENV as TAVILY_KEY_ENV

if TYPE_CHECKING:
    from flowlearn.training.config import FlowGRPOConfig
    from flowlearn.training.run import TrainingParts

ENV = {
    "planner": "FLOWLEARN_PLANNER",
    "engine": "FLOWLEARN_ENGINE",
    "engine_url": "FLOWLEARN_ENGINE_URL",
    "corpus": "FLOWLEARN_CORPUS",
    "web": "FLOWLEARN_WEB_TOOLS",
    "cache_dir": "FLOWLEARN_CACHE",
    "benchmarks_dir": "FLOWLEARN_BENCHMARKS",
    "wikipedia_endpoint": "FLOWLEARN_WIKIPEDIA_URL",
    "python_isolation": "FLOWLEARN_PYTHON_ISOLATION",
    "prompts": "FLOWLEARN_PROMPTS",
}
"""Each `FlowSpec` field a variable may set, and its name; a given value always wins."""
STUDIO_PYTHON_ENV = "FLOWLEARN_STUDIO_PYTHON"
"""Set to 1 to bind the `python` tool in the Studio graph (`FlowSpec.for_studio`); off if unset."""
_TRUE = {"1", "true", "yes"}

PROMPT_SETS: dict[str, Prompts] = {"agentflow": AGENTFLOW_PROMPTS, "smollm2": SMOLLM2_PROMPTS}
"""The prompt sets a flow can be built with, by name: AgentFlow's, and the embedded model's."""


@dataclass(frozen=True, kw_only=True)
class FlowSpec:
    """The names a flow is built from: which models, tools and data, not yet loaded."""

    planner: str = "default"
    """Planner model: "default" (embedded SmolLM2), a hub id, a folder or a .gguf file."""
    engine: str | None = None
    """Fixed engine model; None: the planner's model (one copy in memory)."""
    planner_url: str | None = None
    """Plan on an OpenAI-compatible server at this URL; `planner` names the served model."""
    engine_url: str | None = None
    """Run the fixed engine on an OpenAI-compatible server at this URL (the planner's too, when
    one GPU serves both); `engine` names the served model, whose tokenizer must load here."""
    device: str | None = None
    dtype: str | None = None
    engine_max_new_tokens: int | None = None
    """Token budget of every engine call; None: each engine role's own (`nodes.prompts`)."""
    corpus: str | None = None
    """JSONL corpus for `local_search`; None: the bundled world facts."""
    web: bool = False
    """Bind `wikipedia_search` and `web_search` too."""
    python: bool = True
    """Bind the `python` tool, which runs code the model writes (off in Studio unless asked)."""
    batch_size: int = 1
    """Concurrent calls decoded together (concurrent flows share batches)."""
    cache_dir: str | None = None
    benchmarks_dir: str | None = None
    wikipedia_endpoint: str | None = None
    python_isolation: Isolation = "bwrap"
    """How `python` runs model-written code: "bwrap" (the Linux sandbox, refused where the host
    cannot build it) or "none" (unisolated, with your user's rights: an explicit opt-in)."""
    prompts: str | None = None
    """The prompt set, a `PROMPT_SETS` name: "agentflow" or "smollm2"; None: "smollm2" when
    the planner or the engine is the embedded default, else "agentflow"."""

    def __post_init__(self) -> None:
        """Refuse an engine budget below one token.

        Raises:
            UsageError: `engine_max_new_tokens` below 1.

        """
        if self.engine_max_new_tokens is not None and self.engine_max_new_tokens < 1:
            raise UsageError(
                f"--engine-max-new-tokens must be >= 1, got {self.engine_max_new_tokens}"
            )
        if self.prompts is not None and self.prompts not in PROMPT_SETS:
            raise UsageError(
                f"unknown prompt set {self.prompts!r} (--prompts, ${ENV['prompts']}); "
                f"choose from {sorted(PROMPT_SETS)}"
            )

    def prompt_set(self) -> Prompts:
        """Return the flow's prompts: the named set, else the embedded model's or AgentFlow's.

        A planner folder that `flowlearn train` wrote names the set it was trained under
        (`PROMPTS_RECORD`). Otherwise the smollm2 preset is chosen when the planner (not
        served) or the engine is the embedded default: it is what the shipped planner was
        trained with.
        """
        if self.prompts is not None:
            return PROMPT_SETS[self.prompts]
        try:  # a planner trained here keeps the prompts it was trained under
            trained = None if self.planner_url else recorded_prompts(self.planner)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        if trained is not None:
            if trained not in PROMPT_SETS:
                raise UsageError(
                    f"{self.planner} was trained under the prompt set {trained!r}, which is not "
                    f"one of {sorted(PROMPT_SETS)}; name one with --prompts"
                )
            return PROMPT_SETS[trained]
        embedded = {*DEFAULT_SOURCES, BASE_SOURCE}
        planner = None if self.planner_url else self.planner.lower()
        engine = (self.engine or ("" if self.engine_url else self.planner)).lower()
        uses_embedded = planner in embedded or (not self.engine_url and engine in embedded)
        return SMOLLM2_PROMPTS if uses_embedded else AGENTFLOW_PROMPTS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **given: Any) -> FlowSpec:
        """Fill every field not `given` (or given as None) from its `FLOWLEARN_*` variable."""
        environ = os.environ if environ is None else environ
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(given) - known)
        if unknown:
            raise UsageError(f"unknown flow settings {unknown}; known: {sorted(known)}")
        values = {k: v for k, v in given.items() if v is not None}
        for name, variable in ENV.items():
            if name not in values and environ.get(variable):
                raw = environ[variable]
                values[name] = raw.strip() in _TRUE if name == "web" else raw
        return cls(**values)

    @classmethod
    def for_studio(cls, environ: Mapping[str, str] | None = None) -> FlowSpec:
        """Name the Studio graph's parts: as `from_env`, with `python` only if asked for.

        The Studio graph answers HTTP, not a user at a terminal, so the tool that runs code is
        bound only when `$FLOWLEARN_STUDIO_PYTHON` is 1 (or true, yes).
        """
        environ = os.environ if environ is None else environ
        return cls.from_env(environ, python=environ.get(STUDIO_PYTHON_ENV, "").strip() in _TRUE)

    def bound_tools(self) -> tuple[str, ...]:
        """Names of the tools this spec binds to the graph."""
        names = BASE_TOOLS + WEB_TOOLS if self.web else BASE_TOOLS
        return names if self.python else tuple(n for n in names if n != "python")


def check_names(
    spec: FlowSpec,
    *,
    tools: Sequence[str] | None = None,
    benchmark: str | None = None,
    data: str | None = None,
) -> None:
    """Check every name before any work starts: tools, models, corpus, benchmark, data file.

    Raises:
        UsageError: the first bad name, with the choices or the fix.

    """
    unknown = sorted(set(tools or ()) - set(spec.bound_tools()))
    if unknown:
        hint = "" if spec.web else f" (the web tools {list(WEB_TOOLS)} need web on)"
        if not spec.python and "python" in unknown:
            hint += f" (python is off: the Studio graph binds it only with {STUDIO_PYTHON_ENV}=1)"
        raise UsageError(f"unknown tools {unknown}; available: {list(spec.bound_tools())}{hint}")
    if spec.web and not os.environ.get(TAVILY_KEY_ENV):
        raise UsageError(
            f"web_search needs a Tavily API key: set {TAVILY_KEY_ENV}, or leave web search off"
        )
    if spec.corpus is not None and not Path(spec.corpus).expanduser().is_file():
        raise UsageError(f"corpus {spec.corpus} is not a file; give a JSONL corpus")
    if spec.corpus is not None:
        try:  # read now (and cached): /etc/passwd is a file, not a corpus
            load_index(spec.corpus)
        except (ValueError, OSError) as exc:
            raise UsageError(f"--corpus {spec.corpus} is not a JSONL corpus: {exc}") from None
    if spec.python_isolation not in ISOLATIONS:
        raise UsageError(
            f"unknown python isolation {spec.python_isolation!r} "
            f"(${ENV['python_isolation']}); choose from {list(ISOLATIONS)}"
        )
    if benchmark is not None and benchmark not in BENCHMARKS:
        raise UsageError(f"unknown benchmark {benchmark!r}; known: {', '.join(sorted(BENCHMARKS))}")
    if data is not None and not Path(data).expanduser().is_file():
        raise UsageError(f"data file {data} does not exist")
    if spec.planner_url is not None and spec.planner in {"", "default"}:
        raise UsageError(
            "--planner-url needs --planner: the name the server serves the model under"
        )
    if spec.engine_url is not None and spec.engine in {None, "", "default"}:
        raise UsageError(
            "--engine-url needs --engine: the name the server serves the engine model under "
            "(the local folder or cached hub id it was started on, so its tokenizer loads here)"
        )
    for flag, url in (("--planner-url", spec.planner_url), ("--engine-url", spec.engine_url)):
        if url is not None and not url.startswith(("http://", "https://")):
            raise UsageError(f"{flag} must be the server's base URL, http(s)://HOST:PORT/v1")
    # A served model is named as its server knows it (the engine's tokenizer load checks it).
    planner = None if spec.planner_url else spec.planner
    engine = None if spec.engine_url else spec.engine
    for name in filter(None, (planner, engine)):
        check_model_name(name)


MODEL_FILES = ("config.json", "adapter_config.json")
"""A folder holding one of these is a model (or adapter) folder."""


def check_model_name(name: str) -> None:
    """Refuse a model name that can only mean a local path, when nothing is there."""
    path = Path(name).expanduser()
    looks_local = name.endswith(".gguf") or name.startswith((".", "/", "~")) or name.count("/") > 1
    if looks_local and not path.exists():
        raise UsageError(
            f"model {name!r} does not exist: name a local folder, a .gguf file, a hub id, "
            "or 'default' for the embedded SmolLM2"
        )
    if path.is_dir() and not any((path / f).is_file() for f in MODEL_FILES):
        raise UsageError(
            f"model folder {name!r} holds no model (no {' or '.join(MODEL_FILES)}); name a "
            "folder a model was saved to, a .gguf file or a hub id"
        )


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

    graph: CompiledStateGraph[State, Context, InputState, State]
    context: Context
    planner: Policy
    engine: HFChatModel
    tool_names: list[str]
    prompts: Prompts = AGENTFLOW_PROMPTS

    def settings(self) -> str:
        """Return one line naming the settings a run of this flow uses."""
        context = self.context
        analysis = "on" if runs_analysis(context, self.prompts) else "off"
        return (
            f"prompts: {self.prompts.name}  query analysis: {analysis}  "
            f"temperature: {context.planner_temperature:g}  max turns: {context.max_turns}"
        )


def build_flow(
    spec: FlowSpec,
    context: Context | None = None,
    *,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
) -> Flow:
    """Check the names, load the models and compile the flow.

    Raises:
        UsageError: a bad name or a missing model, with how to fix it.

    """
    context = context or Context()
    check_names(spec, tools=context.tools)
    prompts = spec.prompt_set()
    try:
        planner, engine = load_parts(spec, prompts)
    except (ValueError, ModelNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    tools = build_tools(spec, engine, prompts)
    graph = build_agentflow(planner, engine, tools, prompts=prompts, checkpointer=checkpointer)
    names = sorted(context.tools or [tool.name for tool in tools])
    return Flow(graph, context, planner, engine, names, prompts)


def load_parts(spec: FlowSpec, prompts: Prompts | None = None) -> tuple[Policy, HFChatModel]:
    """Load the planner and the engine: local, or on their servers (`planner_url`, `engine_url`).

    A local planner and a local engine of the same model share one copy in memory; with the
    planner on a server the local model is the engine's; with both served nothing loads here.
    """
    engine: HFChatModel | None = None
    budget = (prompts or spec.prompt_set()).budgets.engine
    if spec.engine_url is not None:
        engine = server_engine(
            spec.engine_url,
            spec.engine,
            fixed_max_new_tokens=spec.engine_max_new_tokens,
            max_new_tokens=budget,
        )
        if spec.planner_url is not None:
            return server_planner(spec.planner_url, spec.planner), engine
    local = (spec.engine or BASE_SOURCE) if spec.planner_url else spec.planner
    models = load_local_models(
        local,
        None if engine is not None else spec.engine,
        device=spec.device,
        dtype=spec.dtype,
        engine_max_new_tokens=spec.engine_max_new_tokens,
        engine_budget=budget,
        batch_size=spec.batch_size,
        cache_dir=spec.cache_dir,
    )
    if spec.planner_url is not None:
        return server_planner(spec.planner_url, spec.planner), models.engine
    return models.planner, engine or models.engine


def load_chat_model(name: str, spec: FlowSpec, *, max_new_tokens: int = 256) -> HFChatModel:
    """Load a local model as a chat model (an LLM judge, say), on the spec's device and cache.

    Raises:
        UsageError: a model that cannot be found, with how to fix it.

    """
    check_model_name(name)
    try:
        policy = HFPolicy.from_pretrained(
            name, device=spec.device, dtype=spec.dtype, cache_dir=spec.cache_dir
        )
    except ModelNotFoundError as exc:
        raise UsageError(str(exc)) from exc
    return HFChatModel(policy=policy, max_new_tokens=max_new_tokens)


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
    return {
        "data": source,
        "limit": limit,
        "scorer": f"judge {judge}" if judge else scorer or (bench.scorer if bench else None),
        "planner": f"{spec.planner} at {spec.planner_url}" if spec.planner_url else spec.planner,
        "engine": f"{spec.engine} at {spec.engine_url}" if spec.engine_url else spec.engine,
        "engine_max_new_tokens": spec.engine_max_new_tokens,
        "prompts": prompts.name,
        "query_analysis": runs_analysis(context, prompts),
        "tools": sorted(context.tools or spec.bound_tools()),
        "corpus": spec.corpus,
        "max_turns": context.max_turns,
        "max_seconds": context.max_seconds,
        **{key: value for key, value in context.planner_sampling().as_dict().items()},
    }


# Local models ------------------------------------------------------------------------------


@dataclass
class LocalModels:
    """The planner policy and the fixed engine; one backend when both name the same model."""

    planner: HFPolicy | BatchingPolicy
    engine: HFChatModel


def load_local_models(
    planner: str = "default",
    engine: str | None = None,
    *,
    device: str | None = None,
    dtype: str | None = None,
    engine_max_new_tokens: int | None = None,
    engine_budget: int = Budgets().engine,
    batch_size: int = 1,
    cache_dir: str | os.PathLike[str] | None = None,
) -> LocalModels:
    """Load the planner and the engine by name ("default", a hub id, a folder or a .gguf).

    An unset `engine` is the planner's model untrained (`default-base` for the default); two
    of the same source share one copy in memory. `engine_max_new_tokens` is every engine
    call's budget (None: each role's own), `engine_budget` that of a call that names none.
    Above 1, `batch_size` decodes concurrent calls together (`BatchingPolicy`).
    """
    engine_source = engine or untrained_twin(planner)  # the default engine is never trained

    def load(source: str) -> HFPolicy:
        return HFPolicy.from_pretrained(source, device=device, dtype=dtype, cache_dir=cache_dir)

    policy = load(planner)
    backend = policy if engine_source == planner else load(engine_source)
    planner_policy: HFPolicy | BatchingPolicy = policy
    engine_policy: HFPolicy | BatchingPolicy = backend
    if batch_size > 1:
        planner_policy = BatchingPolicy(policy, max_batch_size=batch_size)
        shared = backend is policy
        engine_policy = (
            planner_policy if shared else BatchingPolicy(backend, max_batch_size=batch_size)
        )
    return LocalModels(
        planner=planner_policy,
        engine=HFChatModel(
            policy=engine_policy,
            max_new_tokens=engine_budget,
            fixed_max_new_tokens=engine_max_new_tokens,
        ),
    )


# Models on a server (vLLM) -------------------------------------------------------------------


class ServedNameError(UsageError):
    """A served model whose name cannot be used here; the message says what to give."""


def served_tokenizer(name: str) -> Any:
    """Load the tokenizer of the served model `name`, or return None when none loads here."""
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError):
        return None


def server_planner(url: str, model: str) -> ServerPolicy:
    """Return the planner served at `url` as `model`; prompts render here if its tokenizer loads."""
    return ServerPolicy(url, model, tokenizer=served_tokenizer(model))


def server_engine(
    url: str,
    model: str | None,
    *,
    fixed_max_new_tokens: int | None = None,
    max_new_tokens: int = Budgets().engine,
) -> ServerChatModel:
    """Return the fixed engine on the server at `url`, serving `model`.

    Raises:
        ServedNameError: no model named, or one whose tokenizer does not load here.

    """
    if not model or model in {"default", "base"}:
        raise ServedNameError(
            f"--engine-url needs --engine: the name the server at {url} serves the engine "
            f"model under (got {model!r}); serve a local folder (vllm serve /models/X) and "
            "give that path, so its tokenizer loads here too"
        )
    tokenizer = served_tokenizer(model)
    if tokenizer is None:
        raise ServedNameError(
            f"the engine {model!r} on {url}: its tokenizer does not load here, and the engine's "
            "prompts are rendered here (its chat template, the tool-call prefill); serve the "
            "model from a local folder and name that folder with --engine"
        )
    policy = ServerPolicy(url, model, tokenizer=tokenizer)
    return ServerChatModel(
        policy=policy, max_new_tokens=max_new_tokens, fixed_max_new_tokens=fixed_max_new_tokens
    )


# A training job's parts ------------------------------------------------------------------------


def training_spec(config: FlowGRPOConfig) -> FlowSpec:
    """Name the job's planner, engine and tools from the config alone (plus cache folders)."""
    env = FlowSpec.from_env()
    return FlowSpec(
        planner=config.planner or "default",
        engine=None if config.engine == "base" else config.engine,
        engine_max_new_tokens=config.engine_max_new_tokens,
        corpus=config.corpus,
        prompts=config.prompts,
        cache_dir=env.cache_dir,
        benchmarks_dir=env.benchmarks_dir,
    )


def build_training_parts(config: FlowGRPOConfig) -> TrainingParts:
    """Check every name, then load the planner (LoRA-wrapped when asked), engine, tools, data.

    LoRA wraps the planner here, so the frozen base can serve as the engine (`engine: base`).
    Raises `UsageError`: a bad name, or a model that cannot be found, with how to fix it.
    """
    from flowlearn.training.model import load_planner, with_lora
    from flowlearn.training.run import TrainingParts
    from flowlearn.training.vllm.settings import require_vllm

    spec = training_spec(config)
    check_names(spec, tools=config.tools, benchmark=config.benchmark, data=config.data)
    try:
        require_vllm(config)  # use_vllm: vLLM is there, before any model loads
        data = None
        if not config.trajectories:  # a data file with no scorer is scored by exact match
            scorer = config.scorer or (None if config.benchmark else "exact_match")
            _, cases, score, _ = load_work(
                spec,
                benchmark=config.benchmark,
                data=config.data,
                scorer=scorer,
                limit=config.limit,
            )
            data = (cases, score)
        device = "cpu" if config.use_cpu else None  # None: CUDA when available
        model, tokenizer, lora = load_planner(config, spec.planner, spec.cache_dir, device)
    except (ValueError, ModelNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    if lora:
        model = with_lora(model, config)
    handle = ModelHandle(model, tokenizer)  # the live planner and the frozen base share its lock
    parts = TrainingParts(model=model, tokenizer=tokenizer, lora=lora, handle=handle)
    parts.prompts = spec.prompt_set()
    if data is None:
        return parts
    parts.engine = training_engine(config, spec, handle, device)
    parts.tools = build_tools(spec, parts.engine, parts.prompts)
    parts.cases, parts.scorer = data
    return parts


def training_engine(
    config: FlowGRPOConfig, spec: FlowSpec, handle: ModelHandle, device: str | None
) -> HFChatModel:
    """Return the rollouts' fixed engine: on `engine_url`, the frozen base, or its own model.

    Raises:
        UsageError: a served engine whose tokenizer does not load here.

    """
    if config.engine_url is not None:  # the server batches the concurrent rollouts' calls
        return server_engine(
            config.engine_url,
            config.engine,
            fixed_max_new_tokens=config.engine_max_new_tokens,
            max_new_tokens=spec.prompt_set().budgets.engine,
        )
    from flowlearn.training.rollouts import ROLLOUT_CONCURRENCY

    if config.engine == "base":
        backend: HFPolicy = FrozenBasePolicy(HFPolicy.on(handle))
    else:
        backend = HFPolicy.from_pretrained(
            spec.engine or untrained_twin(spec.planner), device=device, cache_dir=spec.cache_dir
        )
    return HFChatModel(
        # the rollouts' engine calls are concurrent too: decoded together, not one by one
        policy=BatchingPolicy(backend, max_batch_size=ROLLOUT_CONCURRENCY),
        max_new_tokens=spec.prompt_set().budgets.engine,
        fixed_max_new_tokens=config.engine_max_new_tokens,
    )
