from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.cli import main
from flowlearn.compose import FlowSpec
from flowlearn.evals import BENCHMARKS, Case, load_benchmark, load_cases, run_eval, write_reports
from flowlearn.evals.benchmarks import score_case
from flowlearn.evals.cases import ANSWER_INSTRUCTION
from flowlearn.evals.harness import read_results
from flowlearn.graphs import Context, build_agentflow

EXPECTED = {
    "bamboogle": 125,
    "2wiki": 200,
    "hotpotqa": 100,
    "musique": 200,
    "aime24": 30,
    "amc23": 40,
    "gameof24": 300,
    "medqa": 300,
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_shipped_benchmark_loads_and_its_reference_scores_1(name: str) -> None:
    cases = load_benchmark(name)
    assert len(cases) == EXPECTED[name]
    assert len({c.id for c in cases}) == len(cases)
    bench = BENCHMARKS[name]
    for case in cases[:25]:
        assert "<answer>" in case.query and case.query.count(ANSWER_INSTRUCTION) <= 1
        ref = case.reference[0] if isinstance(case.reference, list) else case.reference
        assert score_case(bench.scorer, str(ref), case).value == 1.0, (case.id, ref)


def test_registry_covers_the_papers_ten_benchmarks() -> None:
    assert len(BENCHMARKS) == 10
    assert {b.category for b in BENCHMARKS.values()} == {"search", "agentic", "math", "science"}
    assert BENCHMARKS["gaia"].file is None and BENCHMARKS["gaia"].hub_id
    with pytest.raises(KeyError, match="known: 2wiki"):
        load_benchmark("nope")


def test_local_loaders_agree(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "query": "Q1?", "answer": ["x", "y"], "options": []},
        {"id": "b", "query": "Q2 <answer></answer>", "answer": "z", "options": ["A. z"]},
    ]
    (tmp_path / "c.json").write_text(json.dumps(rows))
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.Table.from_pylist([{**r, "answer": json.dumps(r["answer"])} for r in rows]),
        tmp_path / "c.parquet",
    )
    (tmp_path / "q.json").write_text(json.dumps([{"question": "Q?", "answer": 1}]))
    assert load_cases(tmp_path / "q.json")[0].id == "0"
    json_cases = load_cases(tmp_path / "c.json")
    assert json_cases == load_cases(tmp_path / "c.jsonl")
    assert [c.id for c in load_cases(tmp_path / "c.parquet")] == ["a", "b"]
    assert json_cases[0].query.endswith(ANSWER_INSTRUCTION)
    assert json_cases[1].query == "Q2 <answer></answer>"
    assert json_cases[1].metadata["options"] == ["A. z"]
    (tmp_path / "bad.json").write_text(json.dumps([{"id": 1}]))
    with pytest.raises(ValueError, match="record 0 needs a text 'query'"):
        load_cases(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="unsupported file type"):
        (tmp_path / "c.csv").write_text("x")
        load_cases(tmp_path / "c.csv")


@tool
def lookup(query: str) -> str:
    """Look up a fact."""
    return "paris"


def scripted_graph() -> object:
    def engine_text(messages: object, tools: list[dict[str, object]]) -> object:
        from langchain_core.messages import AIMessage

        if tools:
            return AIMessage(
                content="", tool_calls=[{"name": "lookup", "args": {"query": "q"}, "id": "1"}]
            )
        return "Conclusion: STOP\n<answer>paris</answer>"

    policy = ScriptedPolicy(["garbled", plan("lookup")])
    return build_agentflow(policy, FakeChatModel(respond=engine_text), [lookup])


def test_harness_over_20_cases_writes_reports_and_plot(tmp_path: Path) -> None:
    cases = [Case(str(i), f"q{i}", "paris" if i % 4 else "london") for i in range(20)]
    results = run_eval(
        scripted_graph(),
        cases,
        lambda a, c: score_case("exact_match", a, c),
        concurrency=4,
        results_path=tmp_path / "results.jsonl",
        context=Context(max_turns=3),
        progress=False,
    )
    assert [r.id for r in results] == [c.id for c in cases]
    assert sum(r.score for r in results) == 15
    assert all(r.tools == ["lookup"] for r in results)
    summary = write_reports(results, tmp_path, benchmark="demo", paper=50.0, paper_untrained=40.0)
    assert summary["accuracy"] == 75.0
    low, high = summary["accuracy_ci95"]
    assert low < 75 < high
    assert summary["tool_usage"] == {"lookup": 1.0}
    assert summary["terminations"] == {"verifier_stop": 20}
    assert json.loads((tmp_path / "report.json").read_text()) == summary
    assert "| accuracy | 75.0%" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_failed_runs_are_recorded_not_raised(tmp_path: Path) -> None:
    def explode(question: object) -> str:
        raise RuntimeError("model crashed")

    graph = build_agentflow(ScriptedPolicy([explode]), FakeChatModel(), [lookup])
    (result,) = run_eval(
        graph, [Case("x", "q", "a")], lambda a, c: score_case("exact_match", a, c), progress=False
    )
    assert result.score == 0 and result.error == "RuntimeError: model crashed"


def test_killed_eval_resumes_without_redoing_finished_cases(tmp_path: Path) -> None:
    results, started = tmp_path / "results.jsonl", tmp_path / "started.log"
    job = [
        sys.executable,
        str(Path(__file__).parents[1] / "eval_job.py"),
        str(results),
        str(started),
    ]
    child = subprocess.Popen([*job, "0.2"], start_new_session=True)
    deadline = time.time() + 60
    while time.time() < deadline and len(read_results(results)) < 6:
        time.sleep(0.05)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    finished_before = {r.id for r in read_results(results)}
    assert 6 <= len(finished_before) < 20
    subprocess.run([*job, "0"], check=True, timeout=120)
    final = read_results(results)
    assert sorted(int(r.id) for r in final) == list(range(20))  # none lost, none duplicated
    runs = started.read_text().split()
    assert len(runs) <= 20 + 2  # at most the cases in flight at the kill ran twice


def test_eval_cli_with_tiny_model(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        [
            "eval",
            "--benchmark",
            "gameof24",
            "--limit",
            "3",
            "--planner",
            str(tiny_model_dir),
            "--max-turns",
            "1",
            "--max-new-tokens",
            "8",
            "--engine-max-new-tokens",
            "8",
            "--out",
            str(tmp_path),
        ]
    )
    assert status == 0
    assert "gameof24: accuracy" in capsys.readouterr().out
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["cases"] == 3 and summary["paper_accuracy"] == 53.0
    assert (tmp_path / "report.png").exists() and (tmp_path / "report.md").exists()


def test_token_f1_is_reachable_from_eval_collect_and_training(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from flowlearn.training import TrajectoryStore
    from flowlearn.training.config import FlowGRPOConfig
    from flowlearn.training.run import cases_and_scorer

    data = tmp_path / "cases.jsonl"
    data.write_text(json.dumps({"id": "1", "question": "Capital of France?", "answer": "Paris"}))
    small = ["--planner", str(tiny_model_dir), "--max-turns", "1", "--max-new-tokens", "8"]
    small += ["--engine-max-new-tokens", "8", "--data", str(data), "--scorer", "token_f1"]
    assert main(["eval", *small, "--out", str(tmp_path / "eval")]) == 0
    (result,) = read_results(tmp_path / "eval" / "results.jsonl")
    assert result.reason.startswith("F1 ")
    store = tmp_path / "rollouts.jsonl"
    assert main(["collect", *small, "--group-size", "1", "--out", str(store)]) == 0
    (trajectory,) = TrajectoryStore(store).load()
    assert str(trajectory.reward_reason).startswith("F1 ")
    config = FlowGRPOConfig(
        data=str(data), scorer="token_f1", output_dir=str(tmp_path / "train"), use_cpu=True
    )
    cases, scorer = cases_and_scorer(config)
    assert scorer("paris, France", cases[0]).value == pytest.approx(2 / 3)


def test_an_unknown_scorer_fails_before_any_work() -> None:
    from flowlearn.evals.tasks import load_cases_and_scorer

    with pytest.raises(ValueError, match="unknown scorer 'f2'; known: exact_match, game24"):
        load_cases_and_scorer(benchmark="gameof24", scorer="f2")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "exactly one of --benchmark NAME or --data PATH"),
        (["--benchmark", "medqa", "--data", "x.json"], "exactly one of"),
        (["--data", "x.json"], "--data needs --scorer"),
        (["--benchmark", "medqa", "--limit", "0"], "--limit must be >= 1"),
        (["--data", "/nope.json", "--scorer", "exact_match"], "is not a file"),
    ],
)
def test_eval_cli_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", *argv]) == 2
    assert message in capsys.readouterr().err


GAIA_RECORDS = [
    {
        "task_id": "t1",
        "Question": "How many moons has Mars?",
        "Level": "1",
        "Final answer": "2",
        "file_name": "",
    },
    {
        "task_id": "t2",
        "Question": "Sum the column in the attached sheet.",
        "Level": "2",
        "Final answer": "17",
        "file_name": "sheet.xlsx",
    },
]
GPQA_RECORDS = [
    {
        "Record ID": f"rec{i}",
        "Question": f"Which particle is {i}?",
        "Correct Answer": "muon",
        "Incorrect Answer 1": "pion",
        "Incorrect Answer 2": "kaon",
        "Incorrect Answer 3": "tau",
        "High-level domain": "Physics",
    }
    for i in range(8)
]


def test_gated_benchmarks_load_from_the_hub_through_their_adapters(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import datasets

    asked: list[tuple[str, str, str]] = []

    def load_dataset(name: str, config: str, *, split: str) -> list[dict[str, str]]:
        asked.append((name, config, split))
        return {"gaia-benchmark/GAIA": GAIA_RECORDS, "Idavidrein/gpqa": GPQA_RECORDS}[name]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    gaia = load_benchmark("gaia")
    assert asked[-1] == ("gaia-benchmark/GAIA", "2023_all", "validation")
    assert [(c.id, c.reference) for c in gaia] == [("t1", "2")]  # the file task is left out
    assert gaia[0].query.count(ANSWER_INSTRUCTION) == 1
    assert score_case("exact_match", "2", gaia[0]).value == 1.0
    gpqa = load_benchmark("gpqa")
    assert asked[-1] == ("Idavidrein/gpqa", "gpqa_diamond", "train")
    assert len({c.reference for c in gpqa}) > 1  # shuffled: the answer is not always A
    assert gpqa == load_benchmark("gpqa")  # and the same order every time
    for case in gpqa:
        letter = case.reference
        assert f"{letter}. muon" in case.query and f"{letter}. muon" in case.metadata["options"]
        assert score_case("multiple_choice", letter, case).value == 1.0
        assert score_case("multiple_choice", "muon", case).value == 1.0
        assert score_case("multiple_choice", "kaon", case).value == 0.0
    local = tmp_path / "gpqa_diamond.jsonl"  # a local copy with the hub's fields
    local.write_text("\n".join(json.dumps(r) for r in GPQA_RECORDS))
    assert load_benchmark("gpqa", path=local, limit=3) == gpqa[:3]
    (tmp_path / "gpqa.jsonl").write_text(local.read_text())  # a saved copy, found by name
    monkeypatch.setattr(datasets, "load_dataset", None)  # not asked
    assert load_benchmark("gpqa", data_dir=tmp_path) == gpqa
    monkeypatch.setenv("FLOWLEARN_BENCHMARKS", str(tmp_path))  # the CLI's root reads it
    assert FlowSpec.from_env().benchmarks_dir == str(tmp_path)
    monkeypatch.delenv("FLOWLEARN_BENCHMARKS")
    local.write_text(json.dumps({"Question": "q"}))
    with pytest.raises(ValueError, match="lacks the field 'Correct Answer'"):
        load_benchmark("gpqa", path=local)

    def offline(*args: object, **kwargs: object) -> None:
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(FileNotFoundError, match="gated: accept its terms"):
        load_benchmark("gaia")
