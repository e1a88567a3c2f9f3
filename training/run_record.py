"""The run record in `output_dir`: one id per training run, and what its rollouts depend on.

Why it looks like this:
1. Stored rollouts are the cheapest part of a run to lose and the easiest to misuse: a fresh
   run in a folder that holds another run's rollouts would train on them, since rollout ids
   (`step{k}:{case}/{i}`) repeat from run to run. So every run gets an id, written once to
   `run.json` and kept by `--resume`, and every rollout id ends in `@{run_id}`.
2. Only `--resume` reuses stored rollouts, and only when the settings that shape a rollout
   (given the checkpoint's weights) are the ones they were made with: `ROLLOUT_SETTINGS`.
   Settings of the update alone (learning rate, KL, mode, max_steps, ...) may change.
3. A fresh run in a folder with stored rollouts is refused, never cleaned up behind the
   user's back: the rollouts may be the only record of an expensive run.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any

from flowlearn.nodes.files import write_text_atomically

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
ROLLOUTS_FILE = "rollouts.jsonl"
"""Rank 0's rollout store; rank N writes `rollouts.rankN.jsonl` beside it."""

ROLLOUT_SETTINGS = (
    "planner",
    "engine",
    "engine_max_new_tokens",
    "benchmark",
    "data",
    "scorer",
    "limit",
    "corpus",
    "tools",
    "query_analysis",
    "max_turns",
    "temperature",
    "top_p",
    "max_completion_length",
    "num_generations",
    "questions_per_step",
    "seed",
    "data_seed",
    "shuffle_dataset",
    "format_penalty",
)
"""Config fields a stored rollout depends on: the models and tools of the flow, the questions
(which ones each step takes), the planner's sampling, G, and the reward it was given."""


def new_run_id() -> str:
    """Return a fresh run id: 12 hex digits, unique enough for every run a folder will see."""
    return uuid.uuid4().hex[:12]


def rollout_settings(config: Any) -> dict[str, Any]:
    """Return the config's `ROLLOUT_SETTINGS` as JSON values."""
    values = {name: getattr(config, name, None) for name in ROLLOUT_SETTINGS}
    loaded: dict[str, Any] = json.loads(json.dumps(values, default=str))
    return loaded


def stored_rollouts(out: Path) -> list[Path]:
    """Return the rollout stores in `out` that hold anything, every rank's."""
    stem = Path(ROLLOUTS_FILE).stem
    return sorted(p for p in out.glob(f"{stem}*.jsonl") if p.is_file() and p.stat().st_size)


def read_run(out: Path) -> dict[str, Any] | None:
    """Return the run record of `out`, or None when there is none.

    Raises:
        ValueError: a record that is not one (named), rather than a silent new run id.

    """
    path = out / RUN_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path} is not a run record ({exc}); move it aside") from None
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        raise ValueError(f"{path} is not a run record (no run_id); move it aside")
    return record


def check_run(config: Any, *, resuming: bool) -> str | None:
    """Return the id a resumed run keeps (None: a new run); refuse rollouts it must not use.

    Args:
        config: the run's `FlowGRPOConfig`.
        resuming: whether the run continues the one in `output_dir` (`--resume`).

    Raises:
        ValueError: a fresh run in an `output_dir` with stored rollouts, or a resumed run
            whose rollout settings differ from those the stored rollouts were made with.

    """
    if getattr(config, "trajectories", None):
        return None  # offline: nothing rolled out, nothing stored
    out = Path(str(config.output_dir))
    stored = stored_rollouts(out)
    record = read_run(out)
    if not resuming:
        if stored:
            owner = f"run {record['run_id']}" if record else "an earlier run"
            raise ValueError(
                f"{out} already holds the stored rollouts of {owner} "
                f"({', '.join(p.name for p in stored)}); pass --resume to continue that run, "
                "or choose another output_dir (nothing is deleted for you)"
            )
        return None
    if record is None:
        if stored:  # an older flowlearn's run: its ids carry no run id, so none is reused
            logger.warning("%s has no %s: its stored rollouts are not reused", out, RUN_FILE)
        return None
    before, now = dict(record.get("rollout_settings", {})), rollout_settings(config)
    before.setdefault("query_analysis", True)  # recorded before it was a setting: always on
    changed = [name for name in ROLLOUT_SETTINGS if name in before and before[name] != now[name]]
    if changed and stored:
        diff = "; ".join(f"{name} {before[name]!r}, now {now[name]!r}" for name in changed)
        raise ValueError(
            f"--resume: the stored rollouts of run {record['run_id']} in {out} were made with "
            f"other settings ({diff}); resume with the same ones, or choose another output_dir"
        )
    run_id: str = record["run_id"]
    return run_id


def open_run(config: Any, *, resuming: bool) -> str:
    """Check as `check_run`, write the run record, and return this run's id.

    A resumed run keeps its id; a fresh one gets a new id. Call it on the main process only.
    """
    run_id = check_run(config, resuming=resuming) or new_run_id()
    record = {"run_id": run_id, "rollout_settings": rollout_settings(config)}
    path = Path(str(config.output_dir)) / RUN_FILE
    write_text_atomically(path, json.dumps(record, indent=1) + "\n")
    return run_id
