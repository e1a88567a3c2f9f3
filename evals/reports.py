"""Summaries of an eval run as JSON, Markdown and a PNG plot, written atomically.

A report names what ran: the planner and the engine (with their sizes when known), the
settings line `flowlearn eval` prints, the data and the scorer, all from the settings the
output folder's marker records. Where the paper's figures stand beside this run's accuracy,
they are labelled as the paper's (its model, size, judge and turns; `PAPER_SETUP`) and a
caption says they are published results, not this run.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flowlearn.evals.benchmarks import PAPER_SETUP, PaperSetup
from flowlearn.evals.harness import CaseResult
from flowlearn.files import write_atomically, write_text_atomically

logger = logging.getLogger(__name__)

CAPTION_WIDTH, CAPTION_LINE = 180, 0.14
"""The figure caption's characters per line and inches per line (7-point text)."""


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
    settings: Mapping[str, Any] | None = None,
    settings_line: str = "",
    parameters: Mapping[str, int | None] | None = None,
) -> dict[str, Any]:
    """Accuracy with its 95% interval, turns, tool shares, format-error rate, time per case.

    With them, what ran: `settings` as the output folder's marker records them (data, scorer,
    planner, engine, prompts, tools, turns, sampling; `flowlearn.compose.run_settings`), the
    one-line `settings_line` (`Flow.settings()`) and the models' `parameters` ("planner",
    "engine"; None where unknown). With the paper's figures comes `paper_setup`, what they
    were measured with.

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
    has_paper = paper is not None or paper_untrained is not None
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
        "settings": json.loads(json.dumps(dict(settings), default=str))
        if settings is not None
        else None,
        "settings_line": settings_line,
        "parameters": {"planner": None, "engine": None, **(parameters or {})},
        "paper_accuracy": paper,
        "paper_untrained_accuracy": paper_untrained,
        "paper_setup": dataclasses.asdict(PAPER_SETUP) if has_paper else None,
    }


def count_label(parameters: int | None) -> str:
    """Say how large a model is: 30K, 135M, 7.6B parameters ("" when unknown)."""
    if parameters is None:
        return ""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if parameters >= scale:
            value = parameters / scale
            digits = 1 if value < 10 and suffix == "B" else 0
            return f"{value:.{digits}f}{suffix}"
    return str(parameters)


def model_names(summary: Mapping[str, Any]) -> dict[str, str]:
    """Name this run's planner and engine as its recorded settings do."""
    settings = summary.get("settings") or {}
    if not settings:
        return {"planner": "not recorded", "engine": "not recorded"}
    return {
        "planner": str(settings.get("planner")),
        "engine": str(settings.get("engine") or "the planner's model, untrained"),
    }


def run_models(summary: Mapping[str, Any]) -> dict[str, str]:
    """Name this run's planner and engine, each with its size when known."""
    sizes = summary.get("parameters") or {}
    return {
        role: f"{name} ({count_label(sizes.get(role))} parameters)"
        if sizes.get(role) is not None
        else name
        for role, name in model_names(summary).items()
    }


def paper_setup(summary: Mapping[str, Any]) -> PaperSetup | None:
    """Return what the summary's paper figures were measured with; None when it has none."""
    setup = summary.get("paper_setup")
    return PaperSetup(**setup) if setup else None


def run_data(summary: Mapping[str, Any]) -> str:
    """Name the data this run scored: the benchmark or file, and how many of its cases."""
    settings = summary.get("settings") or {}
    source = settings.get("data") or (summary["benchmark"] or "cases")
    which = "first" if settings.get("limit") else "all"
    return f"{source}, {which} {summary['cases']} cases"


def what_ran(summary: Mapping[str, Any]) -> list[str]:
    """Return the Markdown table naming this run's models and settings beside the paper's."""
    settings = summary.get("settings") or {}
    models = run_models(summary)
    setup = paper_setup(summary)
    rows = [
        ("planner", f"`{models['planner']}`"),
        ("engine", f"`{models['engine']}`"),
        ("data", run_data(summary)),
        ("scorer", str(settings.get("scorer") or "not recorded")),
        ("max turns", str(settings.get("max_turns", "not recorded"))),
        ("accuracy", f"{summary['accuracy']:.1f}% over {summary['cases']} cases"),
    ]
    if not setup:
        return ["| | this run |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    paper = [
        f"{setup.model} ({setup.size}), trained with Flow-GRPO / untrained",
        f"{setup.model} ({setup.size}), the paper's backbone",
        f"{summary['benchmark']}, the published test set",
        f"{setup.judge} judge",
        str(setup.max_turns),
        f"{summary['paper_accuracy']}% Flow-GRPO, {summary['paper_untrained_accuracy']}% untrained "
        f"(mean of {setup.trials} trials)",
    ]
    return [
        f"| | this run | {setup.name} (published, not this run) |",
        "|---|---|---|",
        *(f"| {k} | {v} | {p} |" for (k, v), p in zip(rows, paper, strict=True)),
    ]


def to_markdown(summary: dict[str, Any], results: Sequence[CaseResult]) -> str:
    """Render what ran, the summary and the per-case table as Markdown."""
    low, high = summary["accuracy_ci95"]
    settings = summary.get("settings")
    setup = paper_setup(summary)
    lines = [f"# Eval report: {summary['benchmark'] or 'cases'}", "", *what_ran(summary), ""]
    if summary.get("settings_line"):
        lines += [f"Settings: `{summary['settings_line']}`", ""]
    if settings:
        recorded = "; ".join(f"{key}: {value}" for key, value in settings.items())
        lines += [f"All settings, as `flowlearn-run.json` records them: {recorded}.", ""]
    if setup:
        lines += [f"{setup.caption()}.", ""]
    lines += [
        "| metric | value |",
        "|---|---|",
        f"| cases | {summary['cases']} |",
        f"| accuracy | {summary['accuracy']:.1f}% (95% CI {low:.1f} to {high:.1f}) |",
    ]
    if setup:
        lines.append(
            f"| {setup.label(True)} / untrained (not this run) | "
            f"{summary['paper_accuracy']} / {summary['paper_untrained_accuracy']} |"
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


def short_name(model: str, width: int = 60) -> str:
    """Shorten a model's name for a title: no server address, its last `width` characters."""
    name = model.split(" at ", 1)[0].rstrip("/")
    return name if len(name) <= width else "..." + name[-(width - 3) :]


def tick_name(model: str, width: int = 24) -> str:
    """Fit a model's name under a bar: its last two path parts, one a line, each shortened."""
    parts = short_name(model).split("/")[-2:]
    return "/\n".join(p if len(p) <= width else "..." + p[-(width - 3) :] for p in parts)


def caption_lines(summary: Mapping[str, Any]) -> list[str]:
    """Return the caption: this run's models, settings, data and scorer; whose the paper's are."""
    models = run_models(summary)
    settings = summary.get("settings") or {}
    lines = [
        f"This run: planner {models['planner']}; engine {models['engine']}",
        f"data: {run_data(summary)}; scorer: {settings.get('scorer') or 'not recorded'}",
    ]
    if summary.get("settings_line"):
        lines.append("; ".join(part.strip() for part in summary["settings_line"].split("  ")))
    setup = paper_setup(summary)
    if setup:
        lines.append(setup.caption())
    return [part for line in lines for part in textwrap.wrap(line, CAPTION_WIDTH)]


def accuracy_panel(axis: Any, summary: Mapping[str, Any]) -> None:
    """Bars: this run's accuracy with its 95% interval, then the paper's figures, hatched."""
    size = count_label((summary.get("parameters") or {}).get("planner"))
    planner = tick_name(model_names(summary)["planner"])
    labels = [f"this run\n{planner}" + (f"\n({size})" if size else "")]
    values, colours = [summary["accuracy"]], ["#4c72b0"]
    setup = paper_setup(summary) or PAPER_SETUP
    for trained, key, colour in (
        (False, "paper_untrained_accuracy", "#bbbbbb"),
        (True, "paper_accuracy", "#55a868"),
    ):
        if summary.get(key) is not None:
            labels.append(setup.label(trained).replace(", ", ",\n") + f"\n({setup.model})")
            values.append(summary[key])
            colours.append(colour)
    bars = axis.bar(range(len(values)), values, color=colours, edgecolor="black", linewidth=0.5)
    for bar in bars[1:]:
        bar.set_hatch("//")
    if len(bars) > 1:
        axis.legend(
            [bars[0], bars[1]],
            ["this run", "published in the paper, not this run"],
            loc="upper left",
            fontsize=7,
        )
    axis.set_xticks(range(len(values)), labels, fontsize=8)
    low, high = summary["accuracy_ci95"]
    axis.errorbar(
        [0],
        [summary["accuracy"]],
        yerr=[[summary["accuracy"] - low], [high - summary["accuracy"]]],
        fmt="none",
        ecolor="black",
        capsize=6,
    )
    for x, value in enumerate(values):  # above the interval's top on this run's bar
        axis.annotate(
            f"{value:.1f}",
            (x, high if x == 0 else value),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            fontsize=9,
        )
    axis.set_ylim(0, 110)  # room for a label above 100
    axis.set_yticks(range(0, 101, 20))
    axis.set_ylabel("accuracy (%)")
    axis.set_title(f"{summary['benchmark'] or 'eval'}: accuracy (n={summary['cases']})")


def turns_panel(axis: Any, summary: Mapping[str, Any], results: Sequence[CaseResult]) -> None:
    """Bars centred on whole planner turns, counting cases; both axes in whole numbers."""
    from matplotlib.ticker import MaxNLocator

    counts = Counter(int(r.turns) for r in results)
    low, high = min(counts, default=0), max(counts, default=0)
    turns = list(range(low, high + 1))
    axis.bar(turns, [counts[t] for t in turns], width=0.8, color="#4c72b0")
    if len(turns) <= 20:
        axis.set_xticks(turns)
    else:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.yaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("planner turns")
    axis.set_ylabel("cases")
    axis.set_title(f"turns per case (mean {summary['mean_turns']:.2f})")


def report_figure(summary: Mapping[str, Any], results: Sequence[CaseResult]) -> Any:
    """Return the report's figure: accuracy beside the paper's figures, and turns per case.

    The title names this run's planner and engine; the caption names them with their sizes,
    the settings line, the data and the scorer, and says the paper's bars are its published
    figures (model, size, judge, turns), not this run.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    caption = caption_lines(summary)
    below = 0.2 + CAPTION_LINE * len(caption)  # inches the caption takes under the panels
    height = 4.4 + below
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, height))
    accuracy_panel(left, summary)
    turns_panel(right, summary, results)
    models = model_names(summary)
    figure.suptitle(
        f"{summary['benchmark'] or 'eval'}: planner {short_name(models['planner'])}, "
        f"engine {short_name(models['engine'])}",
        fontsize=10,
    )
    text = figure.text(0.01, 0.01, "\n".join(caption), fontsize=7, va="bottom", ha="left")
    text.set_gid("caption")
    figure.tight_layout(rect=(0, below / height, 1, 1))
    return figure


def plot(summary: dict[str, Any], results: Sequence[CaseResult], path: Path) -> None:
    """Draw `report_figure` into a PNG at `path`."""
    import matplotlib.pyplot as plt

    figure = report_figure(summary, results)
    try:
        write_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=110))
    finally:
        plt.close(figure)


def write_reports(
    results: Sequence[CaseResult], out_dir: str | Path, **summary_kwargs: Any
) -> dict[str, Any]:
    """Write report.json, report.md and report.png into `out_dir`; return the summary.

    `summary_kwargs` are `summarize`'s: the benchmark, the paper's figures, and what ran (the
    recorded settings, the settings line and the models' sizes).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(results, **summary_kwargs)
    payload = json.dumps(summary, indent=2, ensure_ascii=False) + "\n"
    write_text_atomically(out / "report.json", payload)
    write_text_atomically(out / "report.md", to_markdown(summary, results))
    plot(summary, results, out / "report.png")
    return summary
