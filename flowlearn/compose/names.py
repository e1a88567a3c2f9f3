"""The flow's names: `FlowSpec` (the one reader of `FLOWLEARN_*` variables) and their checks."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowlearn.engine.saved_adapters import ADAPTERS_RECORD
from flowlearn.errors import UsageError
from flowlearn.evals.benchmarks import BENCHMARKS
from flowlearn.nodes.presets import PROMPT_SETS, prompts_for
from flowlearn.nodes.prompts import (
    Prompts,
    recorded_engine,
)
from flowlearn.nodes.tools import BASE_TOOLS, WEB_TOOLS, Isolation
from flowlearn.nodes.tools.local_search import load_index
from flowlearn.nodes.tools.python_sandbox import ISOLATIONS
from flowlearn.nodes.tools.web_search import KEY_ENV as TAVILY_KEY_ENV

if TYPE_CHECKING:
    pass


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
STUDIO_HOSTS_ENV = "FLOWLEARN_STUDIO_HOSTS"
"""Comma-separated host names, beyond the local ones, the Studio server answers (a tunnel's)."""
STUDIO_PYTHON_ENV = "FLOWLEARN_STUDIO_PYTHON"
"""Set to 1 to bind the `python` tool in the Studio graph (`FlowSpec.for_studio`); off if unset."""
_TRUE = {"1", "true", "yes"}


@dataclass(frozen=True, kw_only=True)
class FlowSpec:
    """The names a flow is built from: which models, tools and data, not yet loaded."""

    planner: str = "default"
    """Planner model: "default" (embedded SmolLM2), a hub id, a folder or a .gguf file; ""
    for a model loaded already that has no name (training's `model=` object)."""
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

    def engine_choice(self) -> tuple[str | None, str]:
        """Return the fixed engine to load (None: the planner's model, untrained) and why.

        A planner folder that `flowlearn train` wrote names the engine it was trained against,
        and that engine stays the engine unless `engine` names another.

        Raises:
            UsageError: a training record that is not one.

        """
        if self.engine:
            return self.engine, "as named"
        try:
            trained = (
                None if self.planner_url or not self.planner else recorded_engine(self.planner)
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from exc
        if trained:
            return trained, f"the one {self.planner} was trained against"
        return None, "the planner's model, untrained"

    def prompt_set(self) -> Prompts:
        """Return the flow's prompts: the named set, else the embedded model's or AgentFlow's.

        A planner folder that `flowlearn train` wrote names the set it was trained under
        (`PROMPTS_RECORD`). Otherwise the smollm2 preset is chosen when the planner (not
        served) or the engine is the embedded default: it is what the shipped planner was
        trained with.
        """
        if self.prompts is not None:
            return PROMPT_SETS[self.prompts]
        planner = None if self.planner_url or not self.planner else self.planner
        engine = None if self.engine_url else (self.engine or self.planner or None)
        try:  # a planner trained here keeps the prompts it was trained under
            return prompts_for(planner, engine)
        except ValueError as exc:
            raise UsageError(str(exc)) from exc

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
    planner_loaded: bool = False,
) -> None:
    """Check every name before any work starts: tools, models, corpus, benchmark, data file.

    `planner_loaded`: the planner is a model object loaded already (training in TRL's shape),
    so its name is a label, not a path to check.

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
    planner = None if spec.planner_url or planner_loaded else spec.planner
    engine = None if spec.engine_url else spec.engine
    for name in filter(None, (planner, engine)):
        check_model_name(name)


MODEL_FILES = ("config.json", "adapter_config.json", ADAPTERS_RECORD)
"""A folder holding one of these is a model (or adapter) folder, or adapters of several nodes."""


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
            f"model folder {name!r} holds no model (no {' or '.join(MODEL_FILES[:2])}) and no "
            f"trained nodes' adapters (no {ADAPTERS_RECORD}); name a folder a model was saved "
            "to, a .gguf file or a hub id"
        )


def studio_hosts(environ: Mapping[str, str] | None = None) -> list[str]:
    """Return the host names `$FLOWLEARN_STUDIO_HOSTS` adds to the Studio server's local ones."""
    environ = os.environ if environ is None else environ
    return [h.strip() for h in environ.get(STUDIO_HOSTS_ENV, "").split(",") if h.strip()]
