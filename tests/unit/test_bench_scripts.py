"""The benches run end to end on a tiny model (their figures are not checked here, their shape is:
arms alternated, repeats with their spread, provenance recorded)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench"


@pytest.mark.slow
def test_the_rollout_speed_bench_reports_both_arms_and_the_ratio(tmp_path: Path) -> None:
    out = tmp_path / "speed.json"
    command = [sys.executable, str(BENCH / "rollout_speed.py"), "--tiny", "--no-update"]
    command += ["--questions", "1", "--group", "4", "--tokens", "8", "--repeats", "3"]
    command += ["--out", str(out), "--work", str(tmp_path / "work"), "--attn", "eager"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    found = re.fullmatch(
        r"flow_over_trl_tokens_per_second=([\d.]+) pairs=(\d+) range=([\d.]+)-([\d.]+)", last
    )
    assert found, last
    report = json.loads(out.read_text())
    pairs = [
        flow / trl
        for flow, trl in zip(report["flow"]["repeats"], report["trl"]["repeats"], strict=True)
    ]
    assert len(pairs) == int(found[2]) == 3
    assert float(found[1]) == round(statistics.median(pairs), 3)
    assert (float(found[3]), float(found[4])) == (round(min(pairs), 3), round(max(pairs), 3))
    # every source of the ratio has an arm of its own, reported over TRL
    for variant in ("flow_no_prefix_sharing", "flow_static_batch", "flow_one_turn"):
        assert report["over_trl"][variant]["n"] == 3
        assert f"{variant}_over_trl_tokens_per_second=" in done.stdout
    assert report["variants"]["flow_one_turn"]["planner_calls"] == 4  # one turn a rollout
    for key in ("commit", "command", "date"):
        assert report[key]
    assert report["machine"]["cpu_cores"] >= 1 and report["machine"]["load_average_at_start"]
    assert report["flow"]["rollouts"] == 4 and report["flow"]["planner_calls"] >= 4
    assert 0 < report["flow"]["occupancy"] <= 1
    assert report["settings"]["attn"] == "eager"  # both arms' attention kernel, as asked
    assert report["settings"]["attn_used"] == ["eager"]  # and what their models ran
    assert out.with_suffix(".txt").read_text().strip().endswith(last)


@pytest.mark.slow
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
    assert len(report["tokens_per_second_ratio_pairs"]) == 1  # one step each, the warm-up's
    # the stock arm generated from the flow's own first-turn planner prompts, not a shorter one
    # every engine call of the rollout bench ran to --rollout-tokens at most, not its role's budget
    spent = report["rollouts_batched_vs_sequential"]["engine_budgets_spent"]
    assert spent and max(spent) <= 8, spent
    assert report["trl_grpo"]["prompts"] == "the flow's first-turn planner prompts"
    assert report["trl_grpo"]["mean_prompt_tokens"] > 500
    assert done.stdout.strip().splitlines()[-1].startswith("wrote ")


@pytest.mark.slow
def test_the_rollouts_bench_decodes_the_same_work_in_its_headline_arms(tmp_path: Path) -> None:
    """`rollouts.py --tiny`: sharing off in both headline arms (equal decoded tokens), sharing's
    saving a line of its own with its count, the planner sampled, three alternated repeats."""
    out = tmp_path / "rollouts.json"
    command = [sys.executable, str(BENCH / "rollouts.py"), "--tiny", "--flows", "4"]
    command += ["--tokens", "8", "--out", str(out), "--work", str(tmp_path / "work")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    found = re.fullmatch(r"batched_over_sequential=([\d.]+) shared_calls=(\d+)", lines[-1])
    assert found, lines[-1]
    assert found[2] == "0"
    report = json.loads(out.read_text())
    assert report["settings"]["planner_temperature"] == 0.7
    assert report["batched_over_sequential"]["n"] == 3
    assert float(found[1]) == round(report["batched_over_sequential"]["median"], 3)
    tokens = report["completion_tokens"]
    assert tokens["sequential"] == tokens["batched"] == tokens["batched_sharing"], tokens
    calls = [run["calls"] for run in report["batched"]["repeats"]]
    assert calls == [run["calls"] for run in report["sequential"]["repeats"]]  # the same work
    planner = [run["planner_calls"] for run in report["batched"]["repeats"]]
    assert min(calls) > min(planner) > 0  # the planner's calls counted with the engine's
    # (one-token forwards are no exact count of decoded tokens: the batched arm reads the last
    # token of a group's shared prompt as a one-token forward too)
    rows = report["decoding_forward_rows"]
    assert all(report["same_planner_completions_in_headline_arms"])
    sharing = next(line for line in lines if line.startswith("sharing_over_batched="))
    assert "pairs=3" in sharing
    # a shared call is not decoded: fewer rows by what was shared (its count may be 0 on a
    # machine too slow for the group's analysis calls to meet in flight)
    shared_runs = report["shared_calls_per_sharing_run"]
    for shared, decoded in zip(shared_runs, rows["batched_sharing"], strict=True):
        assert (decoded < rows["batched"][0]) == (shared > 0)


@pytest.mark.slow
def test_a_bench_refuses_fewer_than_three_repeats(tmp_path: Path) -> None:
    for script in ("rollouts.py", "rollout_speed.py"):
        command = [sys.executable, str(BENCH / script), "--tiny", "--repeats", "2"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode != 0
        assert "at least 3" in done.stderr or ">= 3" in done.stderr, done.stderr


@pytest.mark.slow
def test_the_learning_bench_refuses_unknown_configurations_and_too_few_seeds() -> None:
    script = str(BENCH / "learning.py")
    done = subprocess.run(
        [sys.executable, script, "--greedy", "shipped,nope"], capture_output=True, text=True
    )
    assert done.returncode != 0 and "unknown configurations ['nope']" in done.stderr
    assert "base-smollm2-on" in done.stderr  # the keys it takes are named
    done = subprocess.run([sys.executable, script, "--seeds", "2"], capture_output=True, text=True)
    assert done.returncode != 0 and "--seeds must be >= 3" in done.stderr
