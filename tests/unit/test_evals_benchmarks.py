"""Benchmarks and case files: shipped, local and gated benchmarks load; references score 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flowlearn.compose import FlowSpec
from flowlearn.evals import BENCHMARKS, load_benchmark, load_cases
from flowlearn.evals.benchmarks import score_case
from flowlearn.evals.cases import ANSWER_INSTRUCTION

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
    with pytest.raises(ValueError, match=r"bad.json:1: the record needs a text 'query'"):
        load_cases(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="unsupported file type"):
        (tmp_path / "c.csv").write_text("x")
        load_cases(tmp_path / "c.csv")


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
