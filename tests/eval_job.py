"""A child process for the crash test: evaluates 20 scripted cases slowly, logging each start."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.evals.cases import Case
from flowlearn.evals.harness import run_eval
from flowlearn.evals.scorers import exact_match
from flowlearn.graphs import build_agentflow


def main(results: str, started_log: str, delay: float) -> None:
    @tool
    def lookup(query: str) -> str:
        """Look up a fact."""
        with open(started_log, "a") as log:  # one line per case actually run
            log.write(query + "\n")
        time.sleep(delay)
        return "paris"

    engine = FakeChatModel(
        default_args={"query": "x"}, text="Conclusion: STOP <answer>paris</answer>"
    )
    policy = ScriptedPolicy([plan("lookup")])
    graph = build_agentflow(policy, engine, [lookup])
    cases = [Case(str(i), f"question {i}", "paris") for i in range(20)]
    run_eval(
        graph,
        cases,
        lambda a, c: exact_match(a, c.reference),
        concurrency=2,
        results_path=results,
        progress=False,
    )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
