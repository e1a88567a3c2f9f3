"""Training killed with kill -9 mid-save resumes at its last complete checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from flowlearn.files import save_atomically
from flowlearn.training.run import last_complete_checkpoint

pytest.importorskip("trl")

STEPS = 6
KILL_AT = 3  # killed while saving checkpoint-3: weights written, trainer state not
JOB = Path(__file__).parents[1] / "crash_job.py"


def write_config(path: Path, model: Path, out: Path) -> Path:
    path.write_text(
        f"planner: {model}\nbenchmark: gameof24\nlimit: 6\nnum_generations: 2\n"
        f"questions_per_step: 1\nmax_turns: 1\nmax_completion_length: 8\n"
        f"engine_max_new_tokens: 8\nlearning_rate: 0.001\nsave_steps: 1\nmax_steps: {STEPS}\n"
        f"output_dir: {out}\nbf16: false\nseed: 7\n"
    )
    return path


def train(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "flowlearn", "train", "--config", str(config), *extra]


def steps_questions(out: Path) -> dict[str, list[str]]:
    """Which questions each step trained on, and check no rollout is stored twice."""
    ids, steps = [], {}
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the torn line of a kill; the store skips it too
        ids.append(row["trajectory_id"])
        steps.setdefault(row["trajectory_id"].split(":")[0], set()).add(row["group_id"])
    assert len(ids) == len(set(ids)), "a rollout was stored twice"
    return {step: sorted(groups) for step, groups in steps.items()}


@pytest.mark.slow
def test_training_killed_mid_save_resumes_with_the_same_data(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    killed_out, straight_out = tmp_path / "killed", tmp_path / "straight"
    config = write_config(tmp_path / "k.yaml", tiny_model_dir, killed_out)
    env = {**os.environ, "TQDM_DISABLE": "1"}
    killed = subprocess.run(
        [sys.executable, str(JOB), str(KILL_AT), str(config)],
        env=env,
        stderr=subprocess.DEVNULL,
        timeout=600,
    )
    assert killed.returncode == -signal.SIGKILL
    assert not (killed_out / "final").exists()
    assert (killed_out / f"checkpoint-{KILL_AT - 1}" / "trainer_state.json").exists()
    torn = killed_out / f"checkpoint-{KILL_AT}"
    assert torn.is_dir() and not (torn / "trainer_state.json").exists()
    subprocess.run(train(config, "--resume"), check=True, timeout=600, env=env)
    state = json.loads((killed_out / f"checkpoint-{STEPS}" / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    assert (killed_out / "final" / "config.json").exists()
    straight = write_config(tmp_path / "s.yaml", tiny_model_dir, straight_out)
    subprocess.run(train(straight), check=True, timeout=600, env=env)
    # Same questions at every step as a run never killed; nothing stored twice or lost.
    assert steps_questions(killed_out) == steps_questions(straight_out)
    assert len(steps_questions(killed_out)) == STEPS


def test_a_torn_checkpoint_is_set_aside_and_the_one_before_used(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"weights")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (tmp_path / "checkpoint-3" / "trainer_state.json").write_text('{"global_st')  # torn
    (tmp_path / "checkpoint-4").mkdir()  # killed before its state was written
    assert last_complete_checkpoint(tmp_path) == tmp_path / "checkpoint-2"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-1",
        "checkpoint-2",
        "incomplete-checkpoint-3",
        "incomplete-checkpoint-4",
    ]
    assert last_complete_checkpoint(tmp_path / "missing") is None


def test_an_atomic_save_leaves_the_old_folder_when_it_fails(tmp_path: Path) -> None:
    final = tmp_path / "final"
    save_atomically(final, lambda d: (d.mkdir(), (d / "v").write_text("1")))
    with pytest.raises(RuntimeError):
        save_atomically(final, lambda d: (d.mkdir(), (d / "v").write_text("2"), fail()))
    assert (final / "v").read_text() == "1"
    save_atomically(final, lambda d: (d.mkdir(), (d / "v").write_text("3")))
    assert (final / "v").read_text() == "3"
    assert [p.name for p in tmp_path.iterdir()] == ["final"]


def fail() -> None:
    raise RuntimeError("disk full")
