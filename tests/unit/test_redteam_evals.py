"""Red-team attacks on eval's records: keys in successful tool results, NaN scores, --save twice."""

from __future__ import annotations

import json
import math
import os
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.evals.cases import Case
from flowlearn.evals.harness import CaseResult, run_eval
from flowlearn.evals.reports import summarize, to_markdown, write_reports
from flowlearn.evals.scorers import SCORERS
from flowlearn.files import JsonlFile
from flowlearn.graphs import Context
from flowlearn.graphs import build_agentflow as _build_agentflow
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.secrets import REDACTED

# these tests script the engine by the smollm2 preset's prompt wording
build_agentflow = partial(_build_agentflow, prompts=SMOLLM2_PROMPTS)
KEY = "tvly-REDTEAM-ECHO-5a9c3e71"


@tool
def echo_env(query: str) -> str:
    """Answer with what the environment holds (a tool that leaks in its *successful* result)."""
    return f"found {query}; TAVILY_API_KEY={os.environ.get('TAVILY_API_KEY')}"


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return "Paris"


def test_a_key_echoed_in_a_successful_tool_result_reaches_no_memory_or_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAVILY_API_KEY", KEY)
    engine = FakeChatModel(default_args={"query": "capital of France"})
    graph = build_agentflow(ScriptedPolicy([plan("echo_env")]), engine, [echo_env])
    state = graph.invoke({"question": "Capital of France?"}, context=Context(max_turns=1))
    (action,) = [r for r in state["memory"] if r["kind"] == "action"]
    assert action.get("error") is None and REDACTED in action["result"]  # it ran, redacted
    assert KEY not in json.dumps(state, default=str)  # memory, transitions, prompts, answer
    prompts = [str(m.content) for call in engine.calls for m in call]
    assert prompts and all(KEY not in p for p in prompts)
    run_eval(
        build_agentflow(ScriptedPolicy([plan("echo_env")]), engine, [echo_env]),
        [Case("q", "Capital of France?", "Paris")],
        SCORERS["exact_match"],
        results_path=tmp_path / "results.jsonl",
        states_path=tmp_path / "states.jsonl",
        context=Context(max_turns=1),
        progress=False,
    )
    for name in ("results.jsonl", "states.jsonl"):
        assert KEY not in (tmp_path / name).read_text()
    assert REDACTED in (tmp_path / "states.jsonl").read_text()


def result(case_id: str, score: Any) -> CaseResult:
    return CaseResult(case_id, "q", "r", "a", score, "", 1)


@pytest.mark.parametrize("bad", [math.nan, math.inf, "1", True, 2.0])
def test_a_nan_score_never_makes_the_accuracy_nan(tmp_path: Path, bad: Any) -> None:
    results = [result("a", 1.0), result("b", bad), result("c", 0.0), result("d", 1.0)]
    summary = summarize(results)
    assert summary["accuracy"] == 50.0  # the bad one counted as failed, not as NaN or a pass
    assert summary["invalid_scores"] == 1
    assert all(math.isfinite(x) for x in summary["accuracy_ci95"])
    markdown = to_markdown(summary, results)
    assert "| invalid scores (counted as failed) | 1 |" in markdown and "nan |" not in markdown
    written = write_reports(results, tmp_path)
    assert json.loads((tmp_path / "report.json").read_text())["accuracy"] == 50.0
    assert written["invalid_scores"] == 1


def test_a_nan_score_in_a_resumed_results_file_is_reported_not_averaged(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(
        '{"id": "a", "query": "q", "reference": "Paris", "answer": "x", "score": NaN, '
        '"reason": "", "turns": 1}\n'
    )
    graph = build_agentflow(ScriptedPolicy([plan("lookup")]), FakeChatModel(), [lookup])
    cases = [Case("a", "q?", "Paris"), Case("b", "Capital of France?", "Paris")]
    results = run_eval(graph, cases, SCORERS["exact_match"], results_path=path, progress=False)
    summary = summarize(results)
    assert summary["invalid_scores"] == 1 and math.isfinite(summary["accuracy"])


def test_save_never_holds_a_case_twice_after_a_kill_between_its_two_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kill window: the case ran, one of its two records is written, the other is not."""
    results, states = tmp_path / "results.jsonl", tmp_path / "states.jsonl"
    cases = [Case("a", "Capital of France?", "Paris"), Case("b", "Capital of Spain?", "Madrid")]
    append = JsonlFile.append
    killed: list[str] = []

    def dies_writing_results(self: JsonlFile, record: Any, **kwargs: Any) -> None:
        if self.path == results and record.get("id") == "a" and not killed:
            killed.append("a")  # the process dies here, once: results.jsonl never gets "a"
            raise KeyboardInterrupt
        append(self, record, **kwargs)

    def run() -> list[CaseResult]:
        graph = build_agentflow(ScriptedPolicy([plan("lookup")] * 2), FakeChatModel(), [lookup])
        return run_eval(
            graph,
            cases,
            SCORERS["exact_match"],
            results_path=results,
            states_path=states,
            context=Context(max_turns=1),
            concurrency=1,
            progress=False,
        )

    monkeypatch.setattr(JsonlFile, "append", dies_writing_results)
    with pytest.raises(KeyboardInterrupt):
        run()
    monkeypatch.setattr(JsonlFile, "append", append)
    run()  # the resume
    saved = [r["id"] for r in JsonlFile(states).records()]
    assert sorted(saved) == ["a", "b"] and len(saved) == len(set(saved))
    assert sorted(r["id"] for r in JsonlFile(results).records()) == ["a", "b"]


def test_save_written_by_an_older_flowlearn_is_not_repeated_on_resume(tmp_path: Path) -> None:
    """An older flowlearn wrote the state first: a kill left "a" in --save but not in results."""
    results, states = tmp_path / "results.jsonl", tmp_path / "states.jsonl"
    JsonlFile(states).append({"id": "a", "score": 1.0, "answer": "Paris"})
    graph = build_agentflow(ScriptedPolicy([plan("lookup")]), FakeChatModel(), [lookup])
    run_eval(
        graph,
        [Case("a", "Capital of France?", "Paris")],
        SCORERS["exact_match"],
        results_path=results,
        states_path=states,
        context=Context(max_turns=1),
        progress=False,
    )
    assert [r["id"] for r in JsonlFile(states).records()] == ["a"]
    assert [r["id"] for r in JsonlFile(results).records()] == ["a"]
