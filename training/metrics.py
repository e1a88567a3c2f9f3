"""The run's health: each logged step's metrics as a JSON line, and the reward curve.

Every logging step appends one line to `output_dir/metrics.jsonl` with TRL's own metrics
(loss, entropy, KL, clip ratios, learning rate, step time) and the flow's (`flow/*`: mean
reward, zero-variance group share, format-error rate, mean turns, completion length, rollout
and update seconds, and what the batch left out) plus the mean reward of each group. On
resume, lines past the checkpoint's step are dropped first, so the file never holds a step
twice. The reward curve is redrawn at every save and at the end.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from flowlearn.files import JsonlFile, write_atomically
from flowlearn.training.trajectories import DROPPED, Trajectory

METRICS_FILE = "metrics.jsonl"
CURVE_FILE = "reward_curve.png"

FLOW_STATS = (
    "mean_reward",
    "zero_variance_share",
    "rows",
    "tokens",
    "mean_turns",
    "rows_cut",
    "rows_dropped",
    "trajectories_dropped",
)
"""The `build_flow_grpo_rows` stats logged as `flow/<name>`.

`rows_cut`: completions cut to max_completion_length. `rows_dropped`: turns not trained on
(prompt too long, a zero-variance group dropped, a policy call without token ids).
`trajectories_dropped`: rollouts with no row trained on (those, or a dropped reward error).
"""


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Return the records of a metrics JSONL, skipping a torn line with a warning."""
    return [r for r in JsonlFile(path).records() if isinstance(r, dict)]


def plot_reward_curve(records: list[dict[str, Any]], path: str | Path) -> Path | None:
    """Draw mean reward (and format-error rate) per step into a PNG; None without data."""
    points = [(r["step"], r["flow/mean_reward"]) for r in records if "flow/mean_reward" in r]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    axis.plot(*zip(*points, strict=True), marker="o", label="mean reward")
    key = "flow/format_error_rate"
    errors = [(r["step"], r[key]) for r in records if key in r]
    if errors:
        axis.plot(*zip(*errors, strict=True), linestyle="--", label="format-error rate")
    axis.set_xlabel("step")
    axis.set_ylim(-0.05, 1.05)
    axis.set_title("Flow-GRPO rollouts")
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    try:
        return write_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(figure)


def flow_metrics(
    trajectories: list[Trajectory], stats: dict[str, Any], seconds: float
) -> tuple[dict[str, float], dict[str, float]]:
    """Return one step's `flow/*` metrics and the mean reward of each of its groups."""
    values = {f"flow/{key}": float(stats[key]) for key in FLOW_STATS}
    turns = [
        t
        for trajectory in trajectories
        for t in trajectory.transitions
        if t.get("completion_ids") is not None
    ]
    bad = sum(t["parse_status"] != "ok" for t in turns)
    values["flow/format_error_rate"] = bad / len(turns) if turns else 0.0
    values["flow/completion_length"] = (
        sum(len(t.get("completion_ids") or []) for t in turns) / len(turns) if turns else 0.0
    )
    values["flow/rollout_seconds"] = seconds
    values["flow/reward_errors"] = float(sum(t.reward_error is not None for t in trajectories))
    groups: dict[str, list[float]] = {}
    for trajectory in trajectories:
        if trajectory.metadata.get(DROPPED):  # its reward of 0 was never trained on
            continue
        groups.setdefault(trajectory.group_id, []).append(trajectory.total_reward)
    return values, {g: sum(r) / len(r) for g, r in groups.items()}


class FlowMetricsCallback(TrainerCallback):
    """Write the metrics JSONL and reward curve of a `FlowGRPOTrainer` run."""

    def __init__(self, trainer: Any) -> None:
        """Attach to `trainer`, whose last rollout timing and group rewards it reads."""
        self.trainer = trainer
        self.file = JsonlFile(Path(trainer.args.output_dir) / METRICS_FILE)
        self.path = self.file.path

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Create the file, or cut it back to the step training resumes from."""
        if not state.is_world_process_zero:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= state.global_step]
            self.file.rewrite(kept, default=float)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Record how long the update took after this step's rollouts."""
        ended = getattr(self.trainer, "rollout_ended", None)
        if ended is not None:
            metrics = self.trainer._metrics["train"]
            metrics["flow/update_seconds"].append(time.perf_counter() - ended)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Append this step's metrics and group rewards as one JSON line."""
        if not state.is_world_process_zero or not logs or "flow/mean_reward" not in logs:
            return
        record = {"step": state.global_step, **logs}
        record["group_rewards"] = dict(getattr(self.trainer, "group_rewards", {}))
        self.file.append(record, default=float)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Redraw the reward curve beside the checkpoints."""
        self._plot(state)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Draw the final reward curve."""
        self._plot(state)

    def _plot(self, state: Any) -> None:
        if state.is_world_process_zero and self.path.exists():
            plot_reward_curve(read_metrics(self.path), self.path.parent / CURVE_FILE)
