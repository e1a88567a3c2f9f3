"""The paper's ten benchmarks: category, default scorer, data location and published figures."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from flowlearn.evals.cases import Case, load_cases, read_records
from flowlearn.evals.hub import adapt_records, load_hub_benchmark
from flowlearn.evals.scorers import Score, scorer_named

DATA_ENV = "FLOWLEARN_BENCHMARKS"
"""Named in messages only: the composition root (flowlearn.compose) reads it."""


@dataclass(frozen=True)
class Benchmark:
    """A registered benchmark."""

    name: str
    category: str
    scorer: str
    """A name in `flowlearn.evals.scorers.SCORERS`; `--judge` swaps in the LLM judge, as the
    paper does."""
    file: str | None
    """File name in the benchmarks folder; None for gated sets loaded from the hub."""
    hub_id: str | None = None
    paper: float | None = None
    """AgentFlow + Flow-GRPO accuracy (%) in the paper, under `PAPER_SETUP`."""
    paper_untrained: float | None = None
    """The same flow with its planner untrained, in the paper."""


@dataclass(frozen=True)
class PaperSetup:
    """What the paper's figures (`Benchmark.paper`, `paper_untrained`) were measured with.

    From the paper's tables as `data/SOURCE.md` lists them; a report names these beside its
    own models and settings, since the figures are the paper's, not a run's.
    """

    source: str = "AgentFlow paper (arXiv 2510.05592)"
    model: str = "Qwen2.5-7B-Instruct"
    """The backbone the paper names; its planner is the module Flow-GRPO trains."""
    size: str = "7B"
    judge: str = "GPT-4o"
    max_turns: int = 10
    trials: int = 3
    """Each figure is the mean of this many trials."""

    @property
    def name(self) -> str:
        """Name the paper's flow and its model size: "paper: AgentFlow 7B"."""
        return f"paper: AgentFlow {self.size}"

    def label(self, trained: bool) -> str:
        """Name one of the paper's figures: its flow, model size and planner training."""
        return f"{self.name}, {'Flow-GRPO' if trained else 'untrained'}"

    def caption(self) -> str:
        """Say whose figures these are and how they were measured: not this run's."""
        return (
            f"Paper figures: {self.source}, {self.model} backbone ({self.size}), "
            f"{self.judge} judge, {self.max_turns} turns, mean of {self.trials} trials; "
            "published results, not this run"
        )


PAPER_SETUP = PaperSetup()


BENCHMARKS = {
    b.name: b
    for b in [
        Benchmark("bamboogle", "search", "exact_match", "bamboogle.json", None, 69.6, 58.4),
        Benchmark("2wiki", "search", "exact_match", "2wiki.json", None, 77.2, 60.0),
        Benchmark("hotpotqa", "search", "exact_match", "hotpotqa.json", None, 57.0, 51.3),
        Benchmark("musique", "search", "exact_match", "musique.json", None, 25.3, 19.2),
        Benchmark("gaia", "agentic", "exact_match", None, "gaia-benchmark/GAIA", 33.1, 17.2),
        Benchmark("aime24", "math", "math_equal", "aime24.json", None, 40.0, 16.7),
        Benchmark("amc23", "math", "math_equal", "amc23.json", None, 61.5, 47.4),
        Benchmark("gameof24", "math", "game24", "gameof24.json", None, 53.0, 31.0),
        Benchmark("gpqa", "science", "multiple_choice", None, "Idavidrein/gpqa", 47.0, 37.0),
        Benchmark("medqa", "science", "multiple_choice", "medqa.json", None, 80.0, 76.0),
    ]
}


SHIPPED_DIR = Path(__file__).resolve().parent / "data"
"""The eight files shipped with the package: the AgentFlow authors' published test sets (MIT);
`data/SOURCE.md` says where they come from and lists the paper's figures."""


def benchmarks_dir(data_dir: str | Path | None = None) -> Path:
    """Return the benchmarks folder: `data_dir` when given, else the copy shipped in the package.

    The CLI passes `$FLOWLEARN_BENCHMARKS` here (flowlearn.compose reads the environment).
    """
    return Path(data_dir).expanduser() if data_dir else SHIPPED_DIR


def load_benchmark(
    name: str,
    *,
    path: str | Path | None = None,
    limit: int | None = None,
    data_dir: str | Path | None = None,
) -> list[Case]:
    """Load a registered benchmark from `path`, its file in `data_dir` (else shipped), or the hub.

    GAIA and GPQA (gated, not shipped) are read from `path`, else from `NAME.jsonl` (or .json,
    .parquet) in the benchmarks folder when the user saved a copy there, else from the hub;
    their records keep the hub's fields and go through `flowlearn.evals.hub`'s adapters.

    Raises:
        KeyError: an unknown name, listing the known ones.

    """
    if name not in BENCHMARKS:
        raise KeyError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}")
    bench = BENCHMARKS[name]
    if bench.hub_id is not None:  # gated: a local copy of its records, else the hub
        copies = [
            benchmarks_dir(data_dir) / f"{name}{suffix}"
            for suffix in (".jsonl", ".json", ".parquet")
        ]
        local = Path(path) if path is not None else next((c for c in copies if c.is_file()), None)
        if local is None:
            return load_hub_benchmark(bench.hub_id, limit=limit)
        return adapt_records(bench.hub_id, read_records(local), limit=limit)
    if path is not None:  # a copy of the published set: its repeated ids are suffixed too
        return load_cases(path, limit=limit, suffix_duplicates=True)
    source = benchmarks_dir(data_dir) / str(
        bench.file
    )  # every benchmark not on the hub ships a file
    if not source.is_file():
        raise FileNotFoundError(
            f"{source} not found; set {DATA_ENV} (or pass data_dir) to the folder holding "
            f"{bench.file}, or pass a path"
        )
    return load_cases(source, limit=limit, suffix_duplicates=True)


def score_case(scorer: str, prediction: str, case: Case) -> Score:
    """Score a prediction for `case` with the named rule-based scorer (see `SCORERS`).

    Raises:
        KeyError: an unknown scorer name, listing the known ones.

    """
    return scorer_named(scorer)(prediction, case)
