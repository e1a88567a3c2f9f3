"""What a run writes for people: each step's metrics as a JSON line, plots, a model card.

Every logging step appends one line to `output_dir/metrics.jsonl` with TRL's own metrics
(loss, entropy, KL, clip ratios, learning rate, step time) and the flow's (`flow/*`: mean
reward, zero-variance group share, format-error rate, mean turns, completion length, rollout
and update seconds, and what the batch left out) plus the mean reward of each group. On
resume, lines past the checkpoint's step are dropped first, so the file never holds a step
twice. The reward curve is redrawn at every save and at the end. The model card (README.md,
which TRL writes with every checkpoint) names the base model, the method and how to run the
result, and links nothing that does not exist.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback

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
    "rows_truncated",
    "trajectories_dropped",
)
"""The `build_flow_grpo_rows` stats logged as `flow/<name>`.

`rows_cut`: completions cut to max_completion_length. `rows_dropped`: turns not trained on
(prompt too long, a zero-variance group dropped, a policy call without token ids).
`rows_truncated`: turns cut off by their token budget, not trained on under
`mask_truncated_completions` (0 without it).
`trajectories_dropped`: rollouts with no row trained on (those, or a dropped reward error).
"""


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Return the records of a metrics JSONL, skipping a torn line with a warning."""
    return [r for r in JsonlFile(path).records() if isinstance(r, dict)]


PANELS = (
    ("flow/format_error_rate", "format-error rate"),
    ("loss", "loss"),
    ("kl", "KL to the reference"),
    ("entropy", "entropy (nats/token)"),
)
"""The panels beside the reward: each metric on its own labelled axis, drawn when logged."""


def plot_reward_curve(
    records: list[dict[str, Any]], path: str | Path, title: str = "Flow-GRPO"
) -> Path | None:
    """Draw `reward_figure` into a PNG at `path`; None when no step has a reward yet."""
    import matplotlib.pyplot as plt

    figure = reward_figure(records, title)
    if figure is None:
        return None
    try:
        return write_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(figure)


def reward_figure(records: list[dict[str, Any]], title: str = "Flow-GRPO") -> Any:
    """Return the run's reward and health, one labelled panel each (None: no data).

    The reward panel shows each step's mean reward, its rolling mean (over 5 steps) and the
    spread of the step's group means (one standard deviation). Steps are integers; no axis
    is clipped to a fixed range, so negative rewards and large losses show.
    """
    rows = [r for r in records if "flow/mean_reward" in r]
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    panels = [(key, label) for key, label in PANELS if any(key in r for r in rows)]
    figure, axes = plt.subplots(
        1 + len(panels), 1, figsize=(7, 2.2 * (1 + len(panels))), sharex=True, squeeze=False
    )
    steps = [int(r["step"]) for r in rows]
    means = [float(r["flow/mean_reward"]) for r in rows]
    spreads = [_spread(r.get("group_rewards") or {}) for r in rows]
    reward = axes[0][0]
    reward.plot(steps, means, marker="o", linewidth=1, label="mean reward")
    rolling = [
        sum(means[max(0, i - 4) : i + 1]) / len(means[max(0, i - 4) : i + 1])
        for i in range(len(means))
    ]
    reward.plot(steps, rolling, linewidth=2, label="rolling mean (5 steps)")
    reward.fill_between(
        steps,
        [m - s for m, s in zip(means, spreads, strict=True)],
        [m + s for m, s in zip(means, spreads, strict=True)],
        alpha=0.2,
        label="spread of group means (1 sd)",
    )
    reward.set_ylabel("reward")
    reward.legend(fontsize=7)
    for (key, label), row in zip(panels, axes[1:], strict=True):
        points = [(int(r["step"]), float(r[key])) for r in rows if key in r]
        row[0].plot(*zip(*points, strict=True), marker=".", linewidth=1)
        row[0].set_ylabel(label, fontsize=8)
    for row in axes:
        row[0].grid(alpha=0.3)
        row[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[-1][0].set_xlabel("step")
    figure.suptitle(f"{title}: {len(rows)} steps", fontsize=10)
    figure.tight_layout()
    return figure


def _spread(group_rewards: dict[str, float]) -> float:
    values = [float(v) for v in group_rewards.values()]
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return float((sum((v - mean) ** 2 for v in values) / len(values)) ** 0.5)


NODE_STATS = ("mean_reward", "rows", "tokens", "mean_turns", "zero_variance_share")
"""Each trained node's own `flow/<node>/*` statistics, beside its format errors and TRL's
loss metrics of its micro-batches (`kl`, `entropy`, `clip_ratio/*`: `loop.node_parts`)."""


def flow_metrics(
    trajectories: list[Trajectory],
    stats: dict[str, Any],
    seconds: float,
    node_stats: dict[str, dict[str, Any]] | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Return one step's `flow/*` metrics and the mean reward of each of its groups.

    With `node_stats` (several trained nodes: each node's own row statistics), each node's
    `flow/<node>/*`: its rows' mean reward, rows, tokens, turns and format-error rate.
    """
    values = {f"flow/{key}": float(stats[key]) for key in FLOW_STATS}
    for node, own in (node_stats or {}).items():
        values.update({f"flow/{node}/{key}": float(own[key]) for key in NODE_STATS})
        calls = [
            t
            for trajectory in trajectories
            for t in trajectory.transitions
            if t["node"] == node and t.get("completion_ids") is not None
        ]
        wrong = sum(t["parse_status"] != "ok" for t in calls)
        values[f"flow/{node}/format_error_rate"] = wrong / len(calls) if calls else 0.0
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
    outcomes = [t.reward for t in trajectories if t.reward_error is None]
    if outcomes and all(r in (0.0, 1.0) for r in outcomes):  # right or wrong: an accuracy
        values["flow/accuracy"] = sum(outcomes) / len(outcomes)
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
            model = self.trainer.model.config.name_or_path
            title = f"Flow-GRPO run {self.path.parent.name}, planner {Path(str(model)).name}"
            plot_reward_curve(read_metrics(self.path), self.path.parent / CURVE_FILE, title)


PAPER = "AgentFlow: In-the-Flow Agentic System Optimization (arXiv 2510.05592)"


def model_card(base_model: str | None, run: str, steps: int, trained: str | None = None) -> str:
    """Return the model card of a Flow-GRPO run: base model, method, how to run it, versions."""
    import importlib.metadata as metadata

    versions = []
    for package in ("flowlearn", "trl", "transformers", "torch", "peft"):
        try:
            versions.append(f"- {package}: {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    is_hub_id = base_model is not None and not Path(base_model).exists()
    header = ["---", "library_name: transformers", "tags: [flowlearn, flow-grpo, trl, agentflow]"]
    if is_hub_id:
        header.append(f"base_model: {base_model}")
    base = f"`{base_model}`" if base_model else "a model given in Python"
    return "\n".join(
        [
            *header,
            "---",
            "",
            f"# {run}",
            "",
            f"The planner of an AgentFlow graph, {base} trained with Flow-GRPO ({PAPER}) by "
            f"flowlearn on TRL's GRPOTrainer for {steps} steps"
            + (f" ({trained})." if trained else "."),
            "",
            "## Run it",
            "",
            "```bash",
            'flowlearn run "your question" --planner <this folder>',
            "```",
            "",
            "A `final/` folder names the prompt set and fixed engine it was trained with "
            "(`flowlearn_prompts.json`); `flowlearn run` serves it with both.",
            "",
            "## Framework versions",
            "",
            *versions,
            "",
        ]
    )


def readable_logs(logs: dict[str, Any]) -> dict[str, Any]:
    """Return a step's logs for the console: numbers stay numbers (4 significant digits).

    transformers prints each float as a string (`'loss': '0.1234'`); a log a user copies into
    Python or greps for a value should read as numbers.
    """
    shown = {}
    for key, value in logs.items():
        if key == "total_flos":
            continue
        if isinstance(value, float) and math.isfinite(value):
            value = float(f"{value:.4g}")
        shown[key] = int(value) if isinstance(value, float) and value.is_integer() else value
    return shown


def step_line(logs: dict[str, Any], step: int, max_steps: int, seconds: float) -> str:
    """Return one training step's console line: step, reward, accuracy, KL, loss, seconds.

    >>> step_line({"flow/mean_reward": 0.375, "flow/accuracy": 0.375, "kl": 0.00123,
    ...            "loss": 0.02}, 3, 16, 41.23)
    'step 3/16  reward 0.375  accuracy 37.5%  kl 0.00123  loss 0.02  41.2 s'
    """
    parts = [f"step {step}/{max_steps}", f"reward {logs['flow/mean_reward']:.4g}"]
    if "flow/accuracy" in logs:  # only when every outcome was right or wrong (0 or 1)
        parts.append(f"accuracy {100 * logs['flow/accuracy']:.1f}%")
    parts += [f"{key} {logs[key]:.3g}" for key in ("kl", "loss") if key in logs]
    return "  ".join([*parts, f"{seconds:.1f} s"])


class StepLines:
    """Turn each training log into the line the console shows (`verbose`: the whole dict).

    A step's log becomes `step_line`; the run's closing summary one line of its totals; any
    other log prints whole, as transformers prints it.
    """

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.last = time.perf_counter()

    def __call__(self, logs: dict[str, Any], state: Any) -> str:
        """Return the line for `logs` at `state` (a `TrainerState`)."""
        now, seconds = time.perf_counter(), time.perf_counter() - self.last
        self.last = now
        if self.verbose:
            return str(readable_logs(logs))
        if "flow/mean_reward" in logs:
            return step_line(logs, state.global_step, state.max_steps, seconds)
        if "train_runtime" in logs:
            return f"trained {state.global_step} steps in {logs['train_runtime']:.1f} s"
        return str(readable_logs(logs))


class StepProgressCallback(ProgressCallback):
    """transformers' progress bar, with one line per step written under it (`StepLines`)."""

    def __init__(self, verbose: bool = False) -> None:
        super().__init__()
        self.lines = StepLines(verbose)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Write the step's line under the bar."""
        if state.is_world_process_zero and self.training_bar is not None and logs:
            self.training_bar.write(self.lines(logs, state))


class StepPrinterCallback(PrinterCallback):
    """transformers' log printer (under `disable_tqdm`), one line per step (`StepLines`)."""

    def __init__(self, verbose: bool = False) -> None:
        super().__init__()
        self.lines = StepLines(verbose)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Print the step's line."""
        if state.is_local_process_zero and logs:
            print(self.lines(logs, state))


def console_log_callbacks(trainer: Any, *, verbose: Any) -> None:
    """Swap transformers' console log callbacks on `trainer` for ours (`StepLines`).

    transformers prints every log as a dict of some 60 metrics, each float a string; ours print
    one line a step, or with `verbose` the dict with numbers as numbers. metrics.jsonl and the
    plots (`FlowMetricsCallback`) hold every metric either way.
    """
    for stock, ours in (
        (ProgressCallback, StepProgressCallback),
        (PrinterCallback, StepPrinterCallback),
    ):
        if any(type(c) is stock for c in trainer.callback_handler.callbacks):
            trainer.remove_callback(stock)
            trainer.add_callback(ours(verbose=bool(verbose)))
