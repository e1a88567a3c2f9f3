"""Every published bench figure is read from its result file, and every result file is published.

README.md and docs/performance.md hold their figure tables between `<!-- bench: FILES -->` and
`<!-- /bench -->`; bench/publish.py writes them from bench/results/ (`make bench` runs it).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
spec = importlib.util.spec_from_file_location("publish", ROOT / "bench" / "publish.py")
assert spec and spec.loader
publish = importlib.util.module_from_spec(spec)
spec.loader.exec_module(publish)


@pytest.mark.parametrize("doc", publish.DOCS, ids=lambda p: p.name)
def test_each_published_table_is_what_its_result_files_say(doc: Path) -> None:
    text = doc.read_text()
    assert publish.BLOCK.search(text), f"{doc.name} has no bench table"
    assert publish.render(text) == text, f"{doc.name}: run `python bench/publish.py`"


def test_every_result_file_is_published_with_its_provenance_and_repeats() -> None:
    named = {
        name
        for doc in publish.DOCS
        for found in publish.BLOCK.finditer(doc.read_text())
        for name in found[2].split()
        if name != "learning"  # `<!-- bench: learning FILE -->`: the learning figures
    }
    results = ROOT / "bench" / "results"
    files = {path.name for path in results.glob("*.json")}
    assert files == named, f"unpublished: {files - named}; missing: {named - files}"
    for name in files:
        data = json.loads((results / name).read_text())
        if data.get("kind") == "learning":
            assert data["settings"]["seeds"] >= 3 and "gain_greedy" in data, name
            assert data["settings"]["limit"] is None, name  # a smoke run is not a figure
        else:
            data = publish.load(name)  # refuses a file without provenance or with < 3 repeats
            assert data["headlines"], name
        assert re.fullmatch(r"[0-9a-f]{40}(\+uncommitted)?", data["commit"]), name


def test_a_figure_prints_its_median_range_and_count() -> None:
    headline = {"label": "l", "compared": "c", "unit": "x", "median": 1.234, "min": 1.1,
                "max": 1.31, "n": 3}  # fmt: skip
    assert publish.figure(headline) == "**1.23x** (1.10-1.31, 3 pairs)"
    seconds = headline | {"unit": "ms", "median": 72.4, "min": 70.0, "max": 80.25}
    assert publish.figure(seconds) == "**72.4 ms** (70-80.2, 3 repeats)"


def test_a_smoke_run_or_a_missing_file_is_never_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(publish, "RESULTS", tmp_path)
    learning = json.loads((ROOT / "bench" / "results" / "learning.json").read_text())
    (tmp_path / "learning.json").write_text(json.dumps(learning | {"settings": {"limit": 4}}))
    with pytest.raises(SystemExit, match="a --limit smoke run, not a figure"):
        publish.learning("learning.json")
    block = "<!-- bench: missing.json -->\nold table\n<!-- /bench -->"
    assert publish.present(block) == block  # kept as it was, not half-written
    with pytest.raises(SystemExit, match=r"missing\.json: no such result; run its bench"):
        publish.render(block)
    (tmp_path / "stale.json").write_text(json.dumps({"command": "python bench/x.py"}))
    with pytest.raises(SystemExit, match="lacks commit, date, machine, headlines"):
        publish.load("stale.json")
