"""What a training run writes for people: the reward plot and the model card."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

from flowlearn.training.metrics import model_card, plot_reward_curve, readable_logs, reward_figure


def records() -> list[dict]:
    rows = []
    for step in range(1, 8):
        rows.append(
            {
                "step": step,
                "flow/mean_reward": -0.5 + 0.1 * step,
                "flow/format_error_rate": 0.5 / step,
                "loss": 2.0 / step,
                "kl": 0.001 * step,
                "entropy": 1.5,
                "group_rewards": {"a": -1.0 + 0.1 * step, "b": 0.1 * step},
            }
        )
    return rows


def test_the_plot_has_a_labelled_panel_per_metric_integer_steps_and_no_clipping(
    tmp_path: Path,
) -> None:
    import matplotlib.pyplot as plt

    figure = reward_figure(records(), "Flow-GRPO run r1, planner tiny")
    try:
        labels = [axis.get_ylabel() for axis in figure.axes]
        assert labels == [
            "reward",
            "format-error rate",
            "loss",
            "KL to the reference",
            "entropy (nats/token)",
        ]
        reward = figure.axes[0]
        assert reward.get_ylim()[0] < -0.9  # the spread below the lowest mean shows
        assert [t.get_text() for t in reward.get_legend().get_texts()] == [
            "mean reward",
            "rolling mean (5 steps)",
            "spread of group means (1 sd)",
        ]
        ticks = figure.axes[-1].get_xticks()
        assert all(float(t).is_integer() for t in ticks)
        assert figure.axes[-1].get_xlabel() == "step"
        assert "run r1, planner tiny: 7 steps" in figure.get_suptitle()
    finally:
        plt.close(figure)
    out = plot_reward_curve(records(), tmp_path / "curve.png")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_reward_curve([{"step": 1, "loss": 1.0}], tmp_path / "none.png") is None


def test_the_model_card_names_the_base_and_method_and_links_nothing_made_up(
    tmp_path: Path,
) -> None:
    card = model_card("Qwen/Qwen2.5-7B-Instruct", "train", 32)
    assert "base_model: Qwen/Qwen2.5-7B-Instruct" in card
    assert "Flow-GRPO" in card and "2510.05592" in card and "for 32 steps" in card
    assert 'flowlearn run "your question" --planner <this folder>' in card
    assert "huggingface.co" not in card and "None" not in card
    local = model_card(str(tmp_path), "train", 2)
    assert "base_model:" not in local and f"`{tmp_path}`" in local  # a folder is no hub id


def test_console_logs_read_as_numbers() -> None:
    shown = readable_logs(
        {
            "loss": 0.123456789,
            "epoch": 2.0,
            "flow/mean_reward": -0.5,
            "total_flos": 1e12,
            "kl": float("nan"),
            "note": "x",
        }
    )
    assert shown["loss"] == 0.1235 and shown["epoch"] == 2 and isinstance(shown["epoch"], int)
    assert shown["flow/mean_reward"] == -0.5 and "total_flos" not in shown
    assert shown["note"] == "x" and shown["kl"] != shown["kl"]  # NaN stays a (NaN) number
    assert "'loss': 0.1235" in str(shown)
