"""Summaries of an eval run as JSON, Markdown and a PNG plot, written atomically."""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flowlearn.evals.harness import CaseResult
from flowlearn.files import write_atomically, write_text_atomically

logger = logging.getLogger(__name__)


def valid_score(score: Any) -> bool:
    """Whether `score` is a number a report may count: a finite real in [0, 1], not a bool."""
    return (
        isinstance(score, int | float)
        and not isinstance(score, bool)
        and math.isfinite(score)
        and 0.0 <= score <= 1.0
    )


def wilson_interval(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a proportion (sound at 0, 1 and small n)."""
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(
    results: Sequence[CaseResult],
    *,
    benchmark: str = "",
    paper: float | None = None,
    paper_untrained: float | None = None,
) -> dict[str, Any]:
    """Accuracy with its 95% interval, turns, tool shares, format-error rate, time per case.

    A score that is not a number in [0, 1] (NaN, infinite, a string: a results file edited or
    written by something else) counts as a failed case, never as NaN or a success; how many
    there were is reported as `invalid_scores`, and logged.
    """
    n = len(results)
    invalid = [r.id for r in results if not valid_score(r.score)]
    if invalid:
        logger.warning(
            "%d results have no valid score (not a number in [0, 1]); counted as failed: %s",
            len(invalid),
            ", ".join(invalid[:10]),
        )
    total = sum(float(r.score) for r in results if valid_score(r.score))
    low, high = wilson_interval(total, n)
    tools = Counter(tool for r in results for tool in r.tools)
    calls = sum(tools.values())
    turns = sum(r.turns for r in results)
    return {
        "benchmark": benchmark,
        "cases": n,
        "accuracy": round(100 * total / n, 2) if n else 0.0,
        "accuracy_ci95": [round(100 * low, 2), round(100 * high, 2)],
        "mean_turns": round(turns / n, 3) if n else 0.0,
        "tool_usage": {t: round(c / calls, 4) for t, c in tools.most_common()} if calls else {},
        "format_error_rate": round(sum(r.format_errors for r in results) / turns, 4)
        if turns
        else 0.0,
        "seconds_per_case": round(sum(r.seconds for r in results) / n, 3) if n else 0.0,
        "terminations": dict(Counter(str(r.termination) for r in results)),
        "failed_runs": sum(r.error is not None for r in results),
        "invalid_scores": len(invalid),
        "paper_accuracy": paper,
        "paper_untrained_accuracy": paper_untrained,
    }


def to_markdown(summary: dict[str, Any], results: Sequence[CaseResult]) -> str:
    """Render the summary and the per-case table as Markdown."""
    low, high = summary["accuracy_ci95"]
    lines = [
        f"# Eval report: {summary['benchmark'] or 'cases'}",
        "",
        "| metric | value |",
        "|---|---|",
        f"| cases | {summary['cases']} |",
        f"| accuracy | {summary['accuracy']:.1f}% (95% CI {low:.1f} to {high:.1f}) |",
    ]
    if summary.get("paper_accuracy") is not None:
        lines.append(
            f"| paper (Flow-GRPO / untrained) | {summary['paper_accuracy']} / "
            f"{summary['paper_untrained_accuracy']} |"
        )
    usage = ", ".join(f"{t} {100 * s:.0f}%" for t, s in summary["tool_usage"].items()) or "none"
    lines += [
        f"| mean turns | {summary['mean_turns']:.2f} |",
        f"| tool usage | {usage} |",
        f"| format-error rate | {100 * summary['format_error_rate']:.1f}% of planner turns |",
        f"| seconds per case | {summary['seconds_per_case']:.1f} |",
        f"| terminations | {summary['terminations']} |",
        f"| failed runs | {summary['failed_runs']} |",
        f"| invalid scores (counted as failed) | {summary.get('invalid_scores', 0)} |",
        "",
        "| id | score | turns | answer | reason |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        answer = " ".join(str(r.answer).split())[:60].replace("|", "\\|")
        reason = " ".join(str(r.error or r.reason).split())[:80].replace("|", "\\|")
        score = f"{r.score:.2f}" if valid_score(r.score) else f"invalid ({r.score!r})"
        lines.append(f"| {r.id} | {score} | {r.turns} | {answer} | {reason} |")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], results: Sequence[CaseResult], path: Path) -> None:
    """Plot accuracy beside the paper's figures, and the distribution of turns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels, values = ["this run"], [summary["accuracy"]]
    for label, key in (
        ("paper untrained", "paper_untrained_accuracy"),
        ("paper Flow-GRPO", "paper_accuracy"),
    ):
        if summary.get(key) is not None:
            labels.append(label)
            values.append(summary[key])
    bars = left.bar(labels, values, color=["#4c72b0", "#bbbbbb", "#55a868"][: len(values)])
    low, high = summary["accuracy_ci95"]
    left.errorbar(
        [0],
        [summary["accuracy"]],
        yerr=[[summary["accuracy"] - low], [high - summary["accuracy"]]],
        fmt="none",
        ecolor="black",
        capsize=6,
    )
    left.bar_label(bars, fmt="%.1f")
    left.set_ylim(0, 100)
    left.set_ylabel("accuracy (%)")
    left.set_title(f"{summary['benchmark'] or 'eval'}: accuracy (n={summary['cases']})")
    turns = [r.turns for r in results]
    top = max(turns, default=0)
    right.hist(turns, bins=range(0, top + 2), align="left", rwidth=0.8, color="#4c72b0")
    right.set_xlabel("planner turns")
    right.set_ylabel("cases")
    right.set_title(f"turns per case (mean {summary['mean_turns']:.2f})")
    fig.tight_layout()
    try:
        write_atomically(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    finally:
        plt.close(fig)


def write_reports(
    results: Sequence[CaseResult], out_dir: str | Path, **summary_kwargs: Any
) -> dict[str, Any]:
    """Write report.json, report.md and report.png into `out_dir`; return the summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(results, **summary_kwargs)
    payload = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    write_text_atomically(out / "report.json", payload)
    write_text_atomically(out / "report.md", to_markdown(summary, results))
    plot(summary, results, out / "report.png")
    return summary
