"""Red-team attacks from outside the process: huge questions and results, a user's files."""

from __future__ import annotations

import json
import re
import sqlite3
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool

from flowlearn.cli import main
from flowlearn.engine.scripted import ScriptedChatModel, ScriptedPolicy, planner_turn
from flowlearn.errors import UsageError
from flowlearn.evals.cases import load_cases
from flowlearn.graphs import Context, OutputState, build_agentflow
from flowlearn.nodes.schema.context import MAX_QUESTION_CHARS, QUESTION_CHARS
from flowlearn.outputs import MARKER, claim_folder


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def flow(
    policy: ScriptedPolicy | None = None,
    tools: list[Any] | None = None,
    verdict: str = "STOP",
    **kw: Any,
) -> Any:
    policy = policy or ScriptedPolicy([planner_turn("multiply")])
    text = f"Conclusion: {verdict}\n<answer>391</answer>"
    engine = ScriptedChatModel(default_args={"a": 17, "b": 23}, text=text)
    return build_agentflow(policy, engine, tools or [multiply], **kw)


# Item 10: a question's size, bounded before anything tokenises it -------------------------


def test_a_4mb_question_is_refused_fast_with_bounded_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    question = "7" * 4_000_000
    policy = ScriptedPolicy([planner_turn("multiply")])
    graph = flow(policy)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(ValueError, match="the question has 4,000,000 characters, more than"):
            graph.invoke({"question": question}, context=Context())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 10
    assert peak < 64 * 2**20  # a few copies of the 4 MB text at most, never its tokens
    assert policy.calls == []  # no model saw it
    # the CLI says so before any model loads
    started = time.perf_counter()
    assert main(["run", question]) == 2
    err = capsys.readouterr().err
    assert f"more than the {QUESTION_CHARS:,} a run takes" in err and "--max-question-chars" in err
    assert len(err) < 500 and time.perf_counter() - started < 10
    # the bound is the context's, within a ceiling
    Context(max_question_chars=200_000).check_question("7" * 150_000)
    for bad in (0, MAX_QUESTION_CHARS + 1, 1.5, True):
        with pytest.raises(ValueError, match=r"max_question_chars must be a whole number in \["):
            Context(max_question_chars=bad)  # type: ignore[arg-type]


def test_data_rows_over_the_bound_are_refused_with_their_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    huge = tmp_path / "huge.jsonl"
    rows = [{"id": "a", "query": "1 + 1?", "answer": "2"}]
    rows.append({"id": "b", "query": "7" * (MAX_QUESTION_CHARS + 1), "answer": "7"})
    huge.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=rf"{huge}:2: the record: the question has 1,000,001"):
        load_cases(huge)
    # within the ceiling but over this run's bound: refused before any model loads
    long = tmp_path / "long.jsonl"
    rows[1]["query"] = "7" * (QUESTION_CHARS + 1)
    long.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "eval"
    argv = ["eval", "--data", str(long), "--scorer", "exact_match", "--out", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err  # the question with its answer instruction
    assert re.search(r"case 'b': the question has 100,\d{3} characters, more than", err)
    assert not out.exists()
    pytest.importorskip("trl")
    train = ["train", "--data", str(long), "--output_dir", str(tmp_path / "train")]
    assert main([*train, "--report_to", "none"]) == 2  # the same, before the planner loads
    assert re.search(r"case 'b': the question has 100,\d{3} char", capsys.readouterr().err)


def test_a_huge_tool_result_is_cut_before_it_is_redacted_or_kept() -> None:
    @tool
    def flood(a: int, b: int) -> str:
        """Return a lot of text."""
        return "y" * 5_000_000

    graph = flow(ScriptedPolicy([planner_turn("flood")]), [flood])
    started = time.perf_counter()
    state = graph.invoke({"question": "q"}, context=Context(max_turns=1, max_result_chars=1000))
    assert time.perf_counter() - started < 10
    result = next(r for r in state["memory"] if r["kind"] == "action")["result"]
    assert result.endswith("\n[... truncated 4999000 characters]") and len(result) < 1100


# Item 12: the graph's schemas on this Python (3.11 here) ----------------------------------


def test_the_input_and_output_schemas_name_the_question() -> None:
    graph = flow()
    schema = graph.get_input_jsonschema()
    assert "question" in schema["properties"] and schema.get("required") == ["question"]
    assert "question" in graph.get_output_jsonschema()["properties"]
    served = flow(output_schema=OutputState)
    assert {"answer", "termination"} <= set(served.get_output_jsonschema()["properties"])
    assert "max_question_chars" in graph.get_context_jsonschema()["properties"]


# Item 11: files of the user's own, budgets, node names -----------------------------------


def test_run_save_never_appends_to_a_users_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert main(["run", "What is 2 + 2?", "--save", str(notes)]) == 2
    assert "must be a .jsonl file" in capsys.readouterr().err
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"mine": 1}\n')
    assert main(["run", "What is 2 + 2?", "--save", str(mine)]) == 2
    assert "is not a flowlearn run store" in capsys.readouterr().err
    assert notes.read_text() == "my notes\n" and mine.read_text() == '{"mine": 1}\n'


def test_eval_save_never_appends_to_a_users_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "cases.jsonl"
    data.write_text('{"question": "What is 2 + 2?", "answer": "4"}\n')
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    base = ["eval", "--data", str(data), "--scorer", "exact_match", "--save"]
    assert main([*base, str(notes), "--out", str(tmp_path / "a")]) == 2
    assert "must be a .jsonl file" in capsys.readouterr().err
    mine = tmp_path / "mine.jsonl"
    mine.write_text('{"mine": 1}\n')
    assert main([*base, str(mine), "--out", str(tmp_path / "b")]) == 2
    assert "is not a flowlearn eval store" in capsys.readouterr().err
    assert notes.read_text() == "my notes\n" and mine.read_text() == '{"mine": 1}\n'


def test_checkpoints_never_go_into_a_users_own_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = tmp_path / "app.db"
    with sqlite3.connect(app) as db:
        db.execute("CREATE TABLE users (name TEXT)")
    before = app.read_bytes()
    argv = ["run", "What is 2 + 2?", "--thread", "t1", "--checkpoints", str(app)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "tables of its own (users)" in err and "--checkpoints runs/checkpoints.sqlite" in err
    assert app.read_bytes() == before
    text = tmp_path / "notes.db"
    text.write_text("not a database, my notes\n" * 10)
    assert main([*argv[:-1], str(text)]) == 2
    assert "is not a SQLite database" in capsys.readouterr().err


def test_a_bare_marker_in_a_users_folder_is_not_adopted(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / MARKER).write_text(json.dumps({"command": "eval"}))
    (mine / "report.md").write_text("my report\n")
    with pytest.raises(UsageError, match="is not a marker flowlearn wrote"):
        claim_folder(mine, "eval", {"data": "x"})
    (mine / MARKER).write_text(json.dumps({"command": "eval", "run_id": "abc"}))
    with pytest.raises(UsageError, match="records no settings"):
        claim_folder(mine, "eval", {"data": "x"})
    assert (mine / "report.md").read_text() == "my report\n"


def test_a_budget_too_short_for_a_turn_is_refused_and_an_overrun_is_reported() -> None:
    for seconds in (1e-300, 0.05):
        with pytest.raises(ValueError, match=rf"max_seconds {seconds!r} is below 0.1"):
            Context(max_seconds=seconds)
    assert main(["run", "q?", "--max-seconds", "1e-300"]) == 2

    def slow(messages: Any) -> str:
        time.sleep(0.25)
        return planner_turn("multiply")

    # one turn, past both budgets: the seconds are what ran out
    state = flow(ScriptedPolicy([slow]), verdict="CONTINUE").invoke(
        {"question": "q"}, context=Context(max_turns=1, max_seconds=0.2)
    )
    assert state["termination"] == "max_seconds"


def test_node_names_are_listed_briefly_and_never_twice(tmp_path: Path) -> None:
    from flowlearn.engine.saved_adapters import ADAPTERS_RECORD, read_adapters_record
    from flowlearn.training.roles import check_train_nodes

    many = [f"n{i}" for i in range(200_001)]
    recorded = many[:50_000]  # a record of trained adapters is bounded in bytes too
    with pytest.raises(ValueError) as refused:
        check_train_nodes(many)
    assert "200,001 nodes" in str(refused.value) and len(str(refused.value)) < 400
    with pytest.raises(ValueError, match=r"names \['verifier'\] more than once"):
        check_train_nodes(["planner", "verifier", "verifier"])
    (tmp_path / ADAPTERS_RECORD).write_text(json.dumps({"base": "b", "nodes": recorded}))
    with pytest.raises(ValueError) as missing:
        read_adapters_record(tmp_path)
    assert "(50,000 in all)" in str(missing.value) and len(str(missing.value)) < 600
    twice = {"base": "b", "nodes": ["planner", "planner"]}
    (tmp_path / ADAPTERS_RECORD).write_text(json.dumps(twice))
    with pytest.raises(ValueError, match=r"names nodes twice: \['planner'\]"):
        read_adapters_record(tmp_path)


# Item 14: messages that say what they mean ------------------------------------------------


def test_a_null_answer_is_called_null_and_a_record_is_named_by_its_line(tmp_path: Path) -> None:
    data = tmp_path / "cases.jsonl"
    data.write_text(
        '{"id": "a", "query": "1 + 1?", "answer": "2"}\n{"query": "q", "answer": null}\n'
    )
    with pytest.raises(ValueError) as refused:
        load_cases(data)
    message = str(refused.value)
    assert message.startswith(f"{data}:2: the record needs") and "record 1" not in message
    assert "its 'answer' is null" in message


def test_a_refused_training_folder_names_the_run_id_of_its_marker(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.training.config import FlowGRPOConfig
    from flowlearn.training.run import check_run, claim_output_dir, open_run

    out = tmp_path / "train"
    config = FlowGRPOConfig(benchmark="gameof24", output_dir=str(out), report_to="none")
    claim_output_dir(config, resuming=False)
    run_id = open_run(config, resuming=False)
    marked = json.loads((out / MARKER).read_text())["run_id"]
    assert run_id == marked == json.loads((out / "run.json").read_text())["run_id"]
    (out / "rollouts.jsonl").write_text("{}\n")
    with pytest.raises(ValueError, match=f"stored rollouts of run {marked} "):
        check_run(config, resuming=False)
    # a folder whose marker and run.json disagree (an older flowlearn's) is brought to one id
    record = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**record, "run_id": "older"}))
    assert open_run(config, resuming=True) == "older"
    assert json.loads((out / MARKER).read_text())["run_id"] == "older"
