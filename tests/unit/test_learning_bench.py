"""bench/learning.py's figures: the gain over the strongest untrained configuration measured in
full, and the curtailment that stops a configuration once it cannot be that baseline.

The eval runs are stood in for by a function writing each question's score to the run's results
file, as `flowlearn eval --limit N` does for the first N questions.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "bench"))
spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "bench" / "learning.py")
assert spec and spec.loader
learning = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learning)

CASES = 40
SEEDS = [1, 2, 3]


def stand_in(
    monkeypatch: pytest.MonkeyPatch,
    work: Path,
    right: dict[str, Callable[[int], float]],
    calls: list[tuple[str, int | None, int | None]],
) -> None:
    """`eval_run` writing `right[key](question)` for each of the first `limit` questions."""

    def eval_run(work_: Path, key: str, seed: int | None, limit: int | None) -> None:
        calls.append((key, seed, limit))
        results = learning.folder(work, key, seed) / "results.jsonl"
        results.parent.mkdir(parents=True, exist_ok=True)
        done = learning.scores(work, key, seed, CASES)
        with results.open("a") as file:
            for i in range(limit or CASES):
                if f"q{i}" not in done:
                    row = {"id": f"q{i}", "query": "?", "reference": "r", "answer": "a"}
                    row |= {"score": right[key](i), "reason": "", "turns": 1}
                    file.write(json.dumps(row) + "\n")

    monkeypatch.setattr(learning, "eval_run", eval_run)
    monkeypatch.setattr(
        learning, "question_ids", lambda cases: frozenset(f"q{i}" for i in range(cases))
    )


def test_the_ceiling_counts_every_question_not_yet_run_as_right() -> None:
    assert learning.ceiling([{"a": 0.0, "b": 1.0}], 4) == 0.75
    assert learning.ceiling([{"a": 0.0}, {}, {"a": 1.0, "b": 1.0}], 2) == 5 / 6
    assert learning.ceiling([{f"q{i}": 0.0 for i in range(17)}], 48) == 31 / 48


def test_a_configuration_that_cannot_be_the_strongest_stops_and_publishes_its_ceiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    right = {key: (lambda i: 0.0) for key in learning.CONFIGS}
    right["base-smollm2-on"] = lambda i: float(i % 10 < 7)  # 70%
    right["base-smollm2-off"] = lambda i: float(i % 2 == 0)  # 50%
    right["shipped"] = lambda i: float(i % 10 < 8)  # 80%
    calls: list[tuple[str, int | None, int | None]] = []
    stand_in(monkeypatch, tmp_path, right, calls)
    for key in ["base-smollm2-off", "base-smollm2-on", "base-agentflow-on", "shipped"]:
        for seeds in ([None], SEEDS):
            learning.measure(tmp_path, key, seeds, CASES, curtail=True)

    # The first untrained configuration has no rival measured yet: it runs whole.
    assert ("base-smollm2-off", None, CASES) in calls
    # The AgentFlow one: 16 questions (0 right, so at most 24 of 40 = 60% < 70%), then stopped.
    assert [c for c in calls if c[0] == "base-agentflow-on" and c[1] is None] == [
        ("base-agentflow-on", None, 16)
    ]
    # Sampled, 3 seeds of 40: 16 each leaves 72 of 120 = 60% < 70%: one chunk per seed.
    assert sorted(c for c in calls if c[0] == "base-agentflow-on" and c[1]) == [
        ("base-agentflow-on", s, 16) for s in SEEDS
    ]
    result = learning.figures(tmp_path, SEEDS, CASES, curtail=True)
    stopped = result["configurations"][learning.CONFIGS["base-agentflow-on"][0]]
    assert stopped["greedy"] == {
        "ceiling": 60.0,
        "right": 0,
        "questions_run": 16,
        "of": 40,
        "below": learning.CONFIGS["base-smollm2-on"][0],
        "below_accuracy": 70.0,
    }
    assert stopped["sampled"]["questions_run"] == 48 and stopped["sampled"]["of"] == 120
    greedy = result["gain_greedy"]
    assert greedy["over"] == learning.CONFIGS["base-smollm2-on"][0]
    assert greedy["points"] == 10.0
    assert greedy["untrained_stopped"] == [learning.CONFIGS["base-agentflow-on"][0]]
    assert learning.CONFIGS["base-agentflow-off"][0] + ", greedy" in result["not_measured"]
    # Without curtailment the same partial runs are not a figure, only unfinished.
    whole = learning.figures(tmp_path, SEEDS, CASES, curtail=False)
    assert "greedy" not in whole["configurations"][learning.CONFIGS["base-agentflow-on"][0]]


def test_a_configuration_that_could_still_pass_runs_to_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    right = {key: (lambda i: 0.0) for key in learning.CONFIGS}
    right["base-smollm2-off"] = lambda i: float(i % 2 == 0)  # 50%
    right["base-smollm2-on"] = lambda i: float(i >= 20)  # 0 of the first 20, then all: 50%
    calls: list[tuple[str, int | None, int | None]] = []
    stand_in(monkeypatch, tmp_path, right, calls)
    learning.measure(tmp_path, "base-smollm2-off", [None], CASES, curtail=True)
    assert learning.measure(tmp_path, "base-smollm2-on", [None], CASES, curtail=True) is None
    # 0 of 16, then 12 of 32: the ceiling (24/40, then 20/40, a tie) never fell below 50%.
    assert [c[2] for c in calls if c[0] == "base-smollm2-on"] == [16, 32, 40]
    result = learning.figures(tmp_path, SEEDS, CASES, curtail=True)
    assert result["configurations"][learning.CONFIGS["base-smollm2-on"][0]]["greedy"][
        "accuracy"
    ] == pytest.approx(50.0)


def test_a_longer_run_counts_its_first_questions_and_a_run_adding_none_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    right = {key: (lambda i: float(i % 2 == 0)) for key in learning.CONFIGS}
    calls: list[tuple[str, int | None, int | None]] = []
    stand_in(monkeypatch, tmp_path, right, calls)
    learning.measure(tmp_path, "base-smollm2-off", [None], CASES, curtail=True)
    # A smoke run of the first 8 in the same folder: finished, with 4 of its 8 right.
    assert learning.finished(tmp_path, "base-smollm2-off", None, 8) == {
        f"q{i}": float(i % 2 == 0) for i in range(8)
    }
    assert learning.measure(tmp_path, "base-smollm2-off", [None], 8, curtail=True) is None
    assert len(calls) == 1

    monkeypatch.setattr(learning, "eval_run", lambda *args: None)  # a run that writes nothing
    with pytest.raises(SystemExit, match="an eval run added no question"):
        learning.measure(tmp_path, "base-smollm2-on", [None], CASES, curtail=True)
