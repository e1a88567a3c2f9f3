"""Files a user (or a crash, or a bad scorer) can hand us: refused or repaired, never misread."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from flowlearn.cli import build_parser
from flowlearn.evals.benchmarks import load_benchmark
from flowlearn.evals.cases import load_cases
from flowlearn.evals.tasks import load_cases_and_scorer
from flowlearn.flow_setup import UsageError, context_from_args
from flowlearn.graphs import Context
from flowlearn.nodes.tools.local_search import local_search_tool
from flowlearn.training import Trajectory, TrajectoryStore


def trajectory(tid: str, reward: float, **terms: float) -> Trajectory:
    return Trajectory(tid, "g", "q", "r", "a", "a", reward, reward_terms=dict(terms))


@pytest.mark.parametrize(
    ("reward", "terms"), [(math.nan, {}), (math.inf, {}), (1.0, {"format_penalty": -math.inf})]
)
def test_non_finite_rewards_are_refused_before_anything_is_written(
    tmp_path: Path, reward: float, terms: dict[str, float]
) -> None:
    store = TrajectoryStore(tmp_path / "t.jsonl")
    store.append(trajectory("ok", 1.0))
    with pytest.raises(ValueError, match=r"'bad': field .* is not a finite number"):
        store.append(trajectory("bad", reward, **terms))
    assert [t.trajectory_id for t in store.load()] == ["ok"]


def test_a_duplicated_trajectory_line_is_read_once_with_a_warning(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "t.jsonl")
    for t in (trajectory("a", 1.0), trajectory("b", 0.0)):
        store.append(t)
    lines = store.path.read_text().splitlines()
    store.path.write_text("\n".join([*lines, lines[0]]) + "\n")  # a line pasted twice
    with pytest.warns(UserWarning, match=r"t.jsonl:3: trajectory 'a' appears again"):
        assert [t.trajectory_id for t in store.load()] == ["a", "b"]


def test_case_files_accept_a_byte_order_mark(tmp_path: Path) -> None:
    records = [{"id": "1", "query": "1 + 1?", "reference": "2"}]
    jsonl, listed = tmp_path / "c.jsonl", tmp_path / "c.json"
    jsonl.write_bytes(b"\xef\xbb\xbf" + json.dumps(records[0]).encode() + b"\n")
    listed.write_bytes(b"\xef\xbb\xbf" + json.dumps(records).encode())
    assert [c.id for c in load_cases(jsonl)] == [c.id for c in load_cases(listed)] == ["1"]


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("c.jsonl", '{"id": "1", "query": "q", "reference": "r"}\n{"id": 2,\n', "c.jsonl:2"),
        ("c.jsonl", '{"id": "1", "query": "q", "reference": "r"}\n[1, 2]\n', "c.jsonl:2"),
        ("c.json", '[\n{"id": "1", "query": "q"},\n{"id": }\n]', "c.json:3"),
    ],
)
def test_a_bad_case_file_names_its_line(tmp_path: Path, name: str, text: str, where: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError, match=where):
        load_cases(path)


def test_a_null_corpus_text_is_an_error_naming_its_line(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "Paris is in France."}\n{"id": "b", "text": null}\n')
    with pytest.raises(ValueError, match=r"corpus.jsonl:2: .*'text' must be a string, got None"):
        local_search_tool(corpus)


@pytest.mark.parametrize("seconds", [math.nan, math.inf, -math.inf, -5.0, 0.0])
def test_a_time_budget_that_is_not_a_finite_positive_number_is_refused(seconds: float) -> None:
    """NaN compared false with `<= 0` and so switched the budget off."""
    with pytest.raises(ValueError, match=r"max_seconds must be > 0 \(a finite number of seconds\)"):
        Context(max_seconds=seconds)
    with pytest.raises(ValueError, match=r"tool_timeout_s must be > 0 \(a finite number"):
        Context(tool_timeout_s=seconds)
    args = build_parser().parse_args(["run", "q?", f"--max-seconds={seconds}"])
    with pytest.raises(UsageError, match="max_seconds"):
        context_from_args(args)
    assert Context(max_seconds=0.5).max_seconds == 0.5 and Context().max_seconds is None


@pytest.mark.parametrize(
    ("name", "text", "later", "earlier"),
    [
        (
            "c.jsonl",
            '{"id": "a", "query": "q", "answer": "r"}\n{"id": "b", "query": "q", "answer": "r"}'
            '\n\n{"id": "a", "query": "q2", "answer": "r2"}\n',
            "c.jsonl:4",
            "c.jsonl:1",
        ),
        (
            "c.json",
            json.dumps([{"id": i % 2, "query": "q", "answer": "r"} for i in range(3)], indent=2),
            "c.json:12",
            "c.json:2",
        ),
        (
            "c.json",
            '[{"query": "q", "answer": "r"}, {"id": "0", "query": "q", "answer": "r"}]',
            "c.json:1",
            "c.json:1",
        ),
    ],
)
def test_a_case_file_with_a_repeated_id_is_refused_naming_both_lines(
    tmp_path: Path, name: str, text: str, later: str, earlier: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    where = rf"{later}: case id '\w+' is already used at .*{earlier}\b"
    with pytest.raises(ValueError, match=where):
        load_cases(path)
    with pytest.raises(ValueError, match=where):  # --data, for eval, collect and train alike
        load_cases_and_scorer(data=path, scorer="exact_match")


def test_published_benchmarks_with_repeated_ids_still_load_with_suffixes() -> None:
    medqa = load_benchmark("medqa")
    ids = [case.id for case in medqa]
    assert len(ids) == len(set(ids)) == 300
    suffixed = [case for case in medqa if "source_id" in case.metadata]
    assert suffixed and all(c.id.startswith(c.metadata["source_id"] + "-") for c in suffixed)


def test_a_jsonl_string_holding_a_unicode_line_separator_is_one_record(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    rows = [
        {"id": "a", "query": "one\u2028two", "answer": "x"},
        {"id": "b", "query": "q", "answer": "y"},
    ]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    assert [(c.id, c.reference) for c in load_cases(path)] == [("a", "x"), ("b", "y")]
