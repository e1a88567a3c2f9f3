"""`accelerate launch` with 2 CPU processes: each rolls out its own questions, one model trains.

And it trains as one process would on all their rows: the weights and `num_items_in_batch`
come from the counts of both processes, also when one of them has no row to train on.
"""

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


LAUNCH = [
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    # `--multi_gpu` picks accelerate's torchrun launcher; without CUDA the processes train on
    # CPU over gloo (`--cpu` alone would start a single process, multi-CPU needs MPI).
    "--multi_gpu",
    "--num_processes",
    "2",
    "--num_machines",
    "1",
    "--mixed_precision",
    "no",
    "--dynamo_backend",
    "no",
]
ENV = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("max_staleness", [0, 1], ids=["synchronous", "one-step-off-policy"])
def test_two_process_cpu_training_under_accelerate(
    tiny_model_dir: Path, tmp_path: Path, max_staleness: int
) -> None:
    out = tmp_path / "out"
    config = tmp_path / "train.yaml"
    config.write_text(
        f"planner: {tiny_model_dir}\nbenchmark: gameof24\nlimit: 8\nnum_generations: 2\n"
        f"questions_per_step: 1\nmax_turns: 1\nmax_completion_length: 8\n"
        f"engine_max_new_tokens: 8\nlearning_rate: 0.001\nsave_steps: 1\nmax_steps: 2\n"
        f"output_dir: {out}\nbf16: false\nseed: 3\nmax_staleness: {max_staleness}\n"
    )
    done = subprocess.run(
        [*LAUNCH, "-m", "flowlearn", "train", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
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
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("flow/staleness", 0.0) for r in records] == [0.0, float(max_staleness)]


@pytest.mark.slow
def test_two_processes_make_the_update_of_one_on_the_union(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import torch
    from ddp_job import SCENARIOS, run
    from flow_rows import relative_gap

    job = Path(__file__).parents[1] / "ddp_job.py"
    done = subprocess.run(
        [*LAUNCH, str(job), str(tiny_model_dir), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=900,
        env=ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for name in SCENARIOS:
        run(tiny_model_dir, tmp_path, name, processes=1)
        two = torch.load(tmp_path / f"{name}.2.pt")
        one = torch.load(tmp_path / f"{name}.1.pt")
        halves = [
            set(json.loads((tmp_path / f"{name}.groups.2.{r}.json").read_text())) for r in (0, 1)
        ]
        union = set(json.loads((tmp_path / f"{name}.groups.1.0.json").read_text()))
        assert halves[0] and halves[1] and not halves[0] & halves[1], name
        assert halves[0] | halves[1] == union, name
        assert len(two["grads"]) == len(one["grads"]) == 1, name  # one update per step
        assert relative_gap(two["grads"][0], one["grads"][0]) < 1e-5, name
        assert relative_gap(two["delta"], one["delta"]) < 1e-5, name
        assert max(float(d.abs().max()) for d in one["delta"].values()) > 1e-4, name
