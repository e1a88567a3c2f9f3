"""A child process for the crash test: collects 5 questions x 4 rollouts slowly into a store."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import exact_match
from flowlearn.graphs import build_agentflow
from flowlearn.training import TrajectoryStore, collect


def main(store: str, delay: float) -> None:
    @tool
    def lookup(query: str) -> str:
        """Look up a fact."""
        time.sleep(delay)
        return "paris"

    engine = FakeChatModel(
        default_args={"query": "x"}, text="Conclusion: STOP <answer>paris</answer>"
    )
    graph = build_agentflow(ScriptedPolicy([plan("lookup")]), engine, [lookup])
    cases = [Case(f"q{i}", f"question {i}", "paris") for i in range(5)]
    collect(
        graph,
        cases,
        lambda a, c: exact_match(a, c.reference),
        group_size=4,
        store=TrajectoryStore(store),
        concurrency=2,
        progress=False,
    )


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
