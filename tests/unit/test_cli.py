from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowlearn.cli import main

pytest.importorskip("torch")


def test_run_streams_steps_and_saves_a_token_faithful_trajectory(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs" / "trajectories.jsonl"
    argv = [
        "run",
        "What is 17 * 23?",
        "--planner",
        str(tiny_model_dir),
        "--max-turns",
        "2",
        "--max-new-tokens",
        "16",
        "--engine-max-new-tokens",
        "16",
        "--seed",
        "0",
        "--query-analysis",
        "--save",
        str(out),
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "[analysis]" in printed and "[turn 1]" in printed and "Answer:" in printed
    assert main(argv) == 0  # appends, never overwrites
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    run = json.loads(lines[0])
    assert run["question"] == "What is 17 * 23?" and run["context"]["max_turns"] == 2
    assert run["context"]["query_analysis"] is True
    turns = [t for t in run["transitions"] if t["node"] == "planner"]
    assert turns
    for turn in turns:
        assert turn["prompt_ids"]
        assert len(turn["completion_ids"]) == len(turn["logprobs"]) > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--planner", "/nonexistent/model"], "model '/nonexistent/model' does not exist"),
        (["--max-turns", "0"], "max_turns must be a whole number in [1, 100]"),
        (["--tools", "python,teleport"], "unknown tools ['teleport']"),
        (["--temperature", "-1"], "planner temperature must be a finite number in [0, 10]"),
        (["--corpus", "/nonexistent.jsonl"], "is not a file"),
        (["--web"], "TAVILY_API_KEY"),
    ],
)
def test_run_bad_input_is_a_clear_error(
    tiny_model_dir: Path,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    if "--planner" not in argv:
        argv = [*argv, "--planner", str(tiny_model_dir)]
    assert main(["run", "q", *argv]) == 2
    assert message in capsys.readouterr().err


def test_unknown_option_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "q", "--max-stpes", "3"])
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_run_on_a_thread_and_resume_errors(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ck.sqlite"
    base = [
        "--planner",
        str(tiny_model_dir),
        "--max-turns",
        "1",
        "--max-new-tokens",
        "8",
        "--engine-max-new-tokens",
        "8",
        "--checkpoints",
        str(db),
    ]
    assert main(["run", "q", "--thread", "t1", *base]) == 0
    assert main(["run", "q", "--thread", "t1", *base]) == 2
    assert "already has a run" in capsys.readouterr().err
    assert main(["run", "--resume", "--thread", "t1", *base]) == 0  # finished: nothing to redo
    assert "resuming thread t1 after turn 1" in capsys.readouterr().out
    assert main(["run", "--resume", "--thread", "nope", *base]) == 2
    assert "has no run" in capsys.readouterr().err
    assert main(["run", "--resume", *base]) == 2
    assert "--resume needs --thread" in capsys.readouterr().err
    assert main(["run", *base]) == 2
    assert "give a question" in capsys.readouterr().err


def test_max_steps_is_a_deprecated_alias_of_max_turns(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "runs.jsonl"
    options = ["--planner", str(tiny_model_dir), "--max-new-tokens", "8"]
    options += ["--engine-max-new-tokens", "8", "--save", str(out)]
    with pytest.warns(DeprecationWarning, match="--max-steps is deprecated; use --max-turns"):
        assert main(["run", "2 + 2?", "--max-steps", "1", *options]) == 0
    assert "--max-steps is deprecated" in capsys.readouterr().err
    assert json.loads(out.read_text().splitlines()[-1])["context"]["max_turns"] == 1
