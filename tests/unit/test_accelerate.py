"""`accelerate launch` with 2 CPU processes: each rolls out its own questions, one model trains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")


def step_questions(path: Path) -> dict[str, set[str]]:
    steps: dict[str, set[str]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["trajectory_id"].split(":")[0], set()).add(row["group_id"])
    return steps


def test_two_process_cpu_training_under_accelerate(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = tmp_path / "train.yaml"
    config.write_text(
        f"planner: {tiny_model_dir}\nbenchmark: gameof24\nlimit: 8\nnum_generations: 2\n"
        f"questions_per_step: 1\nmax_turns: 1\nmax_completion_length: 8\n"
        f"engine_max_new_tokens: 8\nlearning_rate: 0.001\nsave_steps: 1\nmax_steps: 2\n"
        f"output_dir: {out}\nbf16: false\nseed: 3\n"
    )
    # `--multi_gpu` picks accelerate's torchrun launcher; without CUDA the processes train on
    # CPU over gloo (`--cpu` alone would start a single process, multi-CPU needs MPI).
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
    ]
    launch += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*launch, "-m", "flowlearn", "train", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    assert (out / "final" / "config.json").exists()
    first, second = (
        step_questions(out / "rollouts.jsonl"),
        step_questions(out / "rollouts.rank1.jsonl"),
    )
    assert sorted(first) == sorted(second) == ["step0", "step1"]
    for step in first:  # the two processes rolled out different questions at each step
        assert first[step] and second[step] and not first[step] & second[step]
