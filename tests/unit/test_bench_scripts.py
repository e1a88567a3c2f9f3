"""The rollout-speed bench runs end to end on a tiny model (its figures are not checked here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench"


def test_the_rollout_speed_bench_reports_both_arms_and_the_ratio(tmp_path: Path) -> None:
    out = tmp_path / "speed.json"
    command = [sys.executable, str(BENCH / "rollout_speed.py"), "--tiny", "--no-update"]
    command += ["--questions", "1", "--group", "4", "--tokens", "8", "--repeats", "2"]
    command += ["--out", str(out), "--work", str(tmp_path / "work"), "--attn", "eager"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("flow_over_trl_tokens_per_second=")
    report = json.loads(out.read_text())
    ratio = (
        report["flow"]["completion_tokens_per_second"]
        / report["trl"]["completion_tokens_per_second"]
    )
    assert float(last.split("=")[1]) == round(ratio, 3)
    assert len(report["flow"]["repeats"]) == len(report["trl"]["repeats"]) == 2
    assert report["flow"]["rollouts"] == 4 and report["flow"]["planner_calls"] >= 4
    assert 0 < report["flow"]["occupancy"] <= 1
    assert report["settings"]["attn"] == "eager"  # both arms' attention kernel, as asked
    assert report["settings"]["attn_used"] == ["eager"]  # and what their models ran
    assert out.with_suffix(".txt").read_text().strip().endswith(last)


def test_the_gpu_training_bench_runs_every_arm_on_cpu(tmp_path: Path) -> None:
    """`gpu_train.py --tiny`: the script a lent GPU runs, checked before it is lent."""
    out = tmp_path / "gpu_train.txt"
    command = [sys.executable, str(BENCH / "gpu_train.py"), "--tiny", "--steps", "1"]
    command += ["--questions", "1", "--group", "2", "--tokens", "8", "--flows", "2"]
    command += ["--rollout-tokens", "8", "--weight-steps", "1"]
    command += ["--out", str(tmp_path / "work"), "--results", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    header, _, body = out.read_text().partition("\n")
    assert "a script check, not the GPU result" in header
    report = json.loads(body)
    for arm in ("flow_grpo", "trl_grpo", "rollouts_batched_vs_sequential", "bf16_weights_move"):
        assert "error" not in report[arm] and report[arm]["arm_seconds"] > 0, report[arm]
    assert report["tokens_per_second_ratio_flow_over_stock"] > 0
    # the stock arm generated from the flow's own first-turn planner prompts, not a shorter one
    # every engine call of the rollout bench ran to --rollout-tokens at most, not its role's budget
    spent = report["rollouts_batched_vs_sequential"]["engine_budgets_spent"]
    assert spent and max(spent) <= 8, spent
    assert report["trl_grpo"]["prompts"] == "the flow's first-turn planner prompts"
    assert report["trl_grpo"]["mean_prompt_tokens"] > 500
    assert done.stdout.strip().splitlines()[-1].startswith("wrote ")
