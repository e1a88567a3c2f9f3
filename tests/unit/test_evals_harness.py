"""The eval harness and `flowlearn eval`: reports, failures, resume after a kill, scorers.

The report names what ran (planner, engine, settings, data, scorer) and labels the paper's
figures as the paper's; its plot is checked on the matplotlib figure itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.cli import main
from flowlearn.compose import Flow, FlowSpec, run_settings
from flowlearn.engine.loading import parameter_count
from flowlearn.evals import Case, CaseResult, run_eval, write_reports
from flowlearn.evals.benchmarks import score_case
from flowlearn.evals.harness import read_results
from flowlearn.evals.reports import count_label, report_figure
from flowlearn.graphs import Context, build_agentflow


@tool
def lookup(query: str) -> str:
    """Look up a fact."""
    return "paris"


def scripted_graph() -> object:
    def engine_text(messages: object, tools: list[dict[str, object]]) -> object:
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


def results_over_turns() -> list[CaseResult]:
    """Cases the flow ran for 1, 2 and 3 planner turns: 2, 3 and 4 of them."""

    def engine_text(messages: object, tools: list[dict[str, object]]) -> object:
        if tools:
            return AIMessage(
                content="", tool_calls=[{"name": "lookup", "args": {"query": "q"}, "id": "1"}]
            )
        return "Conclusion: CONTINUE\n<answer>paris</answer>"

    results: list[CaseResult] = []
    for turns in (1, 2, 3):
        graph = build_agentflow(
            ScriptedPolicy([plan("lookup")]), FakeChatModel(respond=engine_text), [lookup]
        )
        cases = [Case(f"{turns}-{i}", f"q{i}", "paris") for i in range(turns + 1)]
        results += run_eval(
            graph,
            cases,
            lambda a, c: score_case("exact_match", a, c),
            context=Context(max_turns=turns),
            progress=False,
        )
    return results


def test_the_report_names_both_models_compared_and_labels_the_paper_figures(
    tmp_path: Path,
) -> None:
    results = results_over_turns()
    assert sorted(r.turns for r in results) == [1] * 2 + [2] * 3 + [3] * 4
    planner = "HuggingFaceTB/SmolLM2-135M-Instruct"
    context = Context(max_turns=3)
    settings = run_settings(
        FlowSpec(planner=planner), context, benchmark="bamboogle", data=None, scorer=None, limit=9
    )
    flow = Flow(scripted_graph(), context, ScriptedPolicy(["x"]), FakeChatModel(), ["lookup"])
    summary = write_reports(
        results,
        tmp_path,
        benchmark="bamboogle",
        paper=69.6,
        paper_untrained=58.4,
        settings=settings,
        settings_line=flow.settings(),
        parameters={"planner": 134_515_008, "engine": 134_515_008},
    )
    assert json.loads((tmp_path / "report.json").read_text()) == summary
    assert summary["settings"] == json.loads(json.dumps(settings))
    assert summary["paper_setup"]["size"] == "7B" and summary["paper_setup"]["judge"] == "GPT-4o"
    markdown = (tmp_path / "report.md").read_text()
    for row in [
        "| | this run | paper: AgentFlow 7B (published, not this run) |",
        f"| planner | `{planner} (135M parameters)` | Qwen2.5-7B-Instruct (7B), trained with "
        "Flow-GRPO / untrained |",
        "| engine | `the planner's model, untrained (135M parameters)` | Qwen2.5-7B-Instruct (7B), "
        "the paper's backbone |",
        "| data | benchmark bamboogle, first 9 cases | bamboogle, the published test set |",
        "| scorer | exact_match | GPT-4o judge |",
        "| max turns | 3 | 10 |",
        "| accuracy | 100.0% over 9 cases | 69.6% Flow-GRPO, 58.4% untrained (mean of 3 trials) |",
        f"Settings: `{flow.settings()}`",
        "| paper: AgentFlow 7B, Flow-GRPO / untrained (not this run) | 69.6 / 58.4 |",
    ]:
        assert row in markdown, row
    assert "Qwen2.5-7B-Instruct backbone (7B), GPT-4o judge, 10 turns" in markdown
    recorded = "records them: data: benchmark bamboogle; limit: 9; scorer: exact_match; "
    recorded += f"planner: {planner}; engine: None;"
    assert recorded in markdown
    assert "; prompts: agentflow; query_analysis: True; tools: [" in markdown

    figure = report_figure(summary, results)
    try:
        accuracy, turns = figure.axes
        ticks = [t.get_text() for t in accuracy.get_xticklabels()]
        assert ticks == [
            "this run\nHuggingFaceTB/\nSmolLM2-135M-Instruct\n(135M)",
            "paper: AgentFlow 7B,\nuntrained\n(Qwen2.5-7B-Instruct)",
            "paper: AgentFlow 7B,\nFlow-GRPO\n(Qwen2.5-7B-Instruct)",
        ]
        bars = accuracy.patches
        assert [b.get_height() for b in bars] == [100.0, 58.4, 69.6]
        assert [b.get_hatch() for b in bars] == [None, "//", "//"]  # the paper's, hatched
        legend = [t.get_text() for t in accuracy.get_legend().get_texts()]
        assert legend == ["this run", "published in the paper, not this run"]
        (text,) = [t for t in figure.texts if t.get_gid() == "caption"]
        caption = " ".join(text.get_text().split())  # as read, whatever the line breaks
        assert f"planner {planner} (135M parameters)" in caption
        assert "engine the planner's model, untrained (135M parameters)" in caption
        assert "data: benchmark bamboogle, first 9 cases; scorer: exact_match" in caption
        assert "prompts: agentflow; query analysis: on; temperature: 0; max turns: 3" in caption
        assert "Qwen2.5-7B-Instruct backbone (7B), GPT-4o judge" in caption
        assert "published results, not this run" in caption
        assert planner in figure.get_suptitle()
        # whole turns: a bar centred on each, cases counted in whole numbers
        centres = [b.get_x() + b.get_width() / 2 for b in turns.patches]
        assert centres == pytest.approx([1, 2, 3])
        assert [b.get_height() for b in turns.patches] == [2, 3, 4]
        assert all(b.get_width() < 1 for b in turns.patches)
        assert list(turns.get_xticks()) == [1, 2, 3]
        assert all(float(y).is_integer() for y in turns.get_yticks())
        assert turns.get_xlabel() == "planner turns" and turns.get_ylabel() == "cases"
        # the caption sits below the tick labels, inside the figure
        renderer = figure.canvas.get_renderer()
        frame = figure.bbox
        lowest_tick = min(t.get_window_extent(renderer).y0 for t in accuracy.get_xticklabels())
        box = text.get_window_extent(renderer)
        assert box.y1 < lowest_tick and box.x0 >= 0 and box.x1 <= frame.x1 and box.y0 >= 0
    finally:
        plt.close(figure)


def test_each_case_final_state_is_kept_when_asked(tmp_path: Path) -> None:
    cases = [Case(str(i), f"q{i}", "paris" if i else "london") for i in range(3)]
    states = tmp_path / "states.jsonl"
    run_eval(
        scripted_graph(),
        cases,
        lambda a, c: score_case("exact_match", a, c),
        concurrency=2,
        context=Context(max_turns=3),
        progress=False,
        states_path=states,
    )
    rows = {row["id"]: row for row in map(json.loads, states.read_text().splitlines())}
    assert sorted(rows) == ["0", "1", "2"]
    assert [rows[i]["score"] for i in "012"] == [0.0, 1.0, 1.0]
    action = next(r for r in rows["1"]["memory"] if r["kind"] == "action")
    assert action["tool"] == "lookup" and action["result"] == "paris"
    assert rows["1"]["answer"] == "paris" and rows["1"]["transitions"]  # the exact calls too


def test_failed_runs_are_recorded_not_raised(tmp_path: Path) -> None:
    def explode(question: object) -> str:
        raise RuntimeError("model crashed")

    graph = build_agentflow(ScriptedPolicy([explode]), FakeChatModel(), [lookup])
    (result,) = run_eval(
        graph, [Case("x", "q", "a")], lambda a, c: score_case("exact_match", a, c), progress=False
    )
    # the planner records its failed call and the run ends on it; the result names it
    assert result.score == 0 and result.termination == "engine_error"
    assert result.error == "the planner's policy failed: RuntimeError: model crashed"


@pytest.mark.slow
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
    out = capsys.readouterr().out
    assert "gameof24: accuracy" in out
    summary = json.loads((tmp_path / "report.json").read_text())
    assert summary["cases"] == 3 and summary["paper_accuracy"] == 53.0
    assert (tmp_path / "report.png").exists() and (tmp_path / "report.md").exists()
    # what ran is the folder's own record and the line eval printed, not a second account
    marker = json.loads((tmp_path / "flowlearn-run.json").read_text())
    assert summary["settings"] == marker["settings"]
    assert summary["settings"]["planner"] == str(tiny_model_dir)
    line = out.splitlines()[0]
    assert line.startswith("prompts: ") and summary["settings_line"] == line
    size = parameter_count(tiny_model_dir)
    assert summary["parameters"] == {"planner": size, "engine": size}
    assert summary["paper_setup"]["model"] == "Qwen2.5-7B-Instruct"
    markdown = (tmp_path / "report.md").read_text()
    assert f"| planner | `{tiny_model_dir} ({count_label(size)} parameters)` |" in markdown
    assert "| engine | `the planner's model, untrained (" in markdown
    assert "| data | benchmark gameof24, first 3 cases | gameof24, the published test set |" in (
        markdown
    )
    assert "| scorer | game24 | GPT-4o judge |" in markdown
    assert "| max turns | 1 | 10 |" in markdown
    assert f"Settings: `{line}`" in markdown
    assert "published results, not this run" in markdown
    figure = report_figure(summary, read_results(tmp_path / "results.jsonl"))
    try:
        ticks = [t.get_text() for t in figure.axes[0].get_xticklabels()]
        assert ticks[0] == (
            f"this run\n{tiny_model_dir.parent.name}/\n{tiny_model_dir.name}\n({count_label(size)})"
        )
        assert ticks[1:] == [
            "paper: AgentFlow 7B,\nuntrained\n(Qwen2.5-7B-Instruct)",
            "paper: AgentFlow 7B,\nFlow-GRPO\n(Qwen2.5-7B-Instruct)",
        ]
    finally:
        plt.close(figure)


def test_model_sizes_come_from_configs_and_are_unknown_for_a_served_model(
    tiny_model_dir: Path,
) -> None:
    from flowlearn.compose import model_sizes

    size = parameter_count(tiny_model_dir)
    url = "http://127.0.0.1:9/v1"  # never called: sizes are read before anything is
    assert model_sizes(FlowSpec(planner=str(tiny_model_dir))) == {"planner": size, "engine": size}
    served = FlowSpec(planner="m", planner_url=url, engine=str(tiny_model_dir))
    assert model_sizes(served) == {"planner": None, "engine": size}
    both = FlowSpec(planner="m", planner_url=url, engine="e", engine_url=url)
    assert model_sizes(both) == {"planner": None, "engine": None}


def test_token_f1_is_reachable_from_eval_collect_and_training(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from flowlearn.compose import FlowSpec, load_work
    from flowlearn.training import TrajectoryStore
    from flowlearn.training.config import FlowGRPOConfig

    data = tmp_path / "cases.jsonl"
    data.write_text(json.dumps({"id": "1", "question": "Capital of France?", "answer": "Paris"}))
    small = ["--planner", str(tiny_model_dir), "--max-turns", "1", "--max-new-tokens", "8"]
    small += ["--engine-max-new-tokens", "8", "--data", str(data), "--scorer", "token_f1"]
    states = tmp_path / "states.jsonl"
    assert main(["eval", *small, "--out", str(tmp_path / "eval"), "--save", str(states)]) == 0
    (result,) = read_results(tmp_path / "eval" / "results.jsonl")
    assert result.reason.startswith("F1 ")
    markdown = (tmp_path / "eval" / "report.md").read_text()  # a file of cases: no paper
    assert "| data | file cases.jsonl sha256:" in markdown and "| scorer | token_f1 |" in markdown
    assert "paper" not in markdown
    (state,) = map(json.loads, states.read_text().splitlines())  # --save: the final state
    assert state["id"] == "1" and state["score"] == result.score and state["transitions"]
    store = tmp_path / "rollouts.jsonl"
    assert main(["collect", *small, "--group-size", "1", "--out", str(store)]) == 0
    (trajectory,) = TrajectoryStore(store).load()
    assert str(trajectory.reward_reason).startswith("F1 ")
    config = FlowGRPOConfig(
        data=str(data), scorer="token_f1", output_dir=str(tmp_path / "train"), use_cpu=True
    )
    _, cases, scorer, _ = load_work(
        FlowSpec(), benchmark=None, data=config.data, scorer=config.scorer, limit=None
    )
    assert scorer("paris, France", cases[0]).value == pytest.approx(2 / 3)


def test_run_and_eval_decode_greedily_unless_asked_and_collect_samples() -> None:
    from flowlearn.cli import build_parser
    from flowlearn.flow_setup import context_from_args

    def context(*argv: str) -> Context:
        return context_from_args(build_parser().parse_args(list(argv)))

    assert context("eval", "--benchmark", "gameof24").planner_temperature == 0.0
    assert context("eval", "--temperature", "0.7").planner_temperature == 0.7
    assert context("run", "q").planner_temperature == 0.0  # as eval
    assert context("run", "q", "--temperature", "0.7").planner_temperature == 0.7
    collected = context("collect", "--benchmark", "gameof24", "--out", "r.jsonl")
    assert collected.planner_temperature == 0.7 and collected.max_turns == 3


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
        (["--benchmark", "medqa", "--limit", "0"], "--limit must be in [1, 10000000], got 0"),
        (["--data", "/nope.json", "--scorer", "exact_match"], "is not a file"),
        (["--benchmark", "medqa", "--save", "/tmp"], "--save /tmp is a folder"),
    ],
)
def test_eval_cli_bad_input(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["eval", *argv]) == 2
    assert message in capsys.readouterr().err
