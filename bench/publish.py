"""Write the published figure tables of README.md and docs/performance.md from bench/results/.

Run: `python bench/publish.py` (`make bench` runs it last; `--check` only reports what differs).
A table whose result files are not all there yet is left as it is (`--check` and the test
refuse it).
A table sits between `<!-- bench: FILE ... -->` and `<!-- /bench -->`, the files named in the
opening marker; each row is one figure of a result file's `headlines`: what was compared, its
median with the min-max range over its repeats and their count, and the machine and date of the
run. tests/unit/test_published_figures.py fails when a table and its files disagree.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DOCS = [ROOT / "README.md", ROOT / "docs" / "performance.md"]
BLOCK = re.compile(r"(<!-- bench: ([^>]*?) -->\n)(.*?)(<!-- /bench -->)", re.DOTALL)
REQUIRED = ("commit", "command", "date", "machine", "headlines")


def number(value: float, unit: str) -> str:
    """`value` as the docs print it in `unit` (x: a ratio, to 2 decimals; s, ms, GiB: 3 figures)."""
    if unit == "x":
        return f"{value:.2f}"
    return f"{value:.3g}" if abs(value) < 999.5 else f"{value:,.0f}"


def figure(headline: dict[str, Any]) -> str:
    """`**1.23x** (1.10-1.31, 3 repeats)`."""
    unit = headline["unit"]
    suffix = "x" if unit == "x" else f" {unit}"
    low, high = number(headline["min"], unit), number(headline["max"], unit)
    return (
        f"**{number(headline['median'], unit)}{suffix}** "
        f"({low}-{high}, {headline['n']} {'pairs' if unit == 'x' else 'repeats'})"
    )


def load(name: str) -> dict[str, Any]:
    """A result file, checked to hold what a published figure needs."""
    path = RESULTS / name
    if not path.is_file():
        raise SystemExit(f"{path}: no such result; run its bench (make bench)")
    data = json.loads(path.read_text())
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise SystemExit(f"{path}: lacks {', '.join(missing)}; rerun its bench (make bench)")
    for headline in data["headlines"]:
        if headline["n"] < 3:
            raise SystemExit(f"{path}: '{headline['label']}' has {headline['n']} repeats (< 3)")
    return data


def machine(data: dict[str, Any]) -> str:
    facts = data["machine"]
    device = facts.get("device", "cpu")
    where = f"{facts['cpu_cores']} CPU cores" if device == "cpu" else device
    load_now = facts.get("load_average_at_start")
    return where + (f", load {load_now[0]:.1f}" if load_now else "")


def table(names: list[str]) -> str:
    """The Markdown table of every headline of the result files `names`."""
    rows = [
        "| bench | what was compared | figure (median, range) | machine, date |",
        "|---|---|---|---|",
    ]
    for name in names:
        data = load(name)
        command = data["command"].removeprefix("python ")
        for headline in data["headlines"]:
            rows.append(
                f"| `{command}` | {headline['label']}: {headline['compared']} | "
                f"{figure(headline)} | {machine(data)}, {data['date'][:10]} |"
            )
    return "\n".join(rows) + "\n"


def learning(name: str) -> str:
    """The learning figures (bench/learning.py): the headline sentence, then every configuration."""
    path = RESULTS / name
    if not path.is_file():
        raise SystemExit(f"{path}: no such result; run bench/learning.py (make bench-learning)")
    data = json.loads(path.read_text())
    if "gain_greedy" not in data:
        raise SystemExit(f"{path}: no gain measured yet; run bench/learning.py")
    if data["settings"].get("limit") is not None:
        raise SystemExit(f"{path}: a --limit smoke run, not a figure; rerun bench/learning.py")
    configurations = data["configurations"]
    head = next(name for name, c in configurations.items() if c["key"] == "shipped")
    seeds, temperature = data["settings"]["seeds"], data["settings"]["temperature"]

    def gain(decoding: str) -> str:
        found = data.get(f"gain_{decoding}")
        if found is None:
            return "not measured yet"
        low, high = found["ci95"]
        points = f"**{found['points']:+.1f} points**"
        shown = "" if low > 0 else ", which includes zero" if high >= 0 else ", wholly below zero"
        untrained = sum(c["planner"] == "default-base" for c in configurations.values())
        measured, stopped = found["untrained_measured"], found.get("untrained_stopped", [])
        left = untrained - len(measured) - len(stopped)
        counts = f"the strongest of {len(measured)} of {untrained} untrained run in full"
        counts += f"; {len(stopped)} cannot pass it" if stopped else ""
        counts += f"; {left} not run yet" if left else ""
        return f"{points} (95% CI {low:+.1f} to {high:+.1f}{shown}) over {found['over']} ({counts})"

    def cell(figures: dict[str, Any], decoding: str) -> str:
        found = figures.get(decoding)
        if found is None:
            return "not measured yet"
        if "ceiling" in found:  # stopped early: even all the rest right could not pass `below`
            return (
                f"at most {found['ceiling']:.1f}% ({found['right']:g} right in "
                f"{found['questions_run']} of {found['of']} run; cannot pass "
                f"{found['below_accuracy']:.1f}%)"
            )
        low, high = found["ci95"]
        return f"{found['accuracy']:.1f}% ({low:.1f}-{high:.1f})"

    lines = [
        f"On the tool task's test split ({data['cases']} questions no tuning read, "
        f"`{data['split']['file']}`, SHA-256 `{data['split']['sha256'][:12]}`), the shipped "
        f"planner at its defaults against the strongest untrained configuration: "
        f"greedy {gain('greedy')}; sampled at T={temperature}, mean of {seeds} seeds, "
        f"{gain('sampled')}. The strongest baseline is picked on this split after the fact, "
        "which favours the baseline.",
        "",
        f"| configuration | greedy | sampled (T={temperature}, {seeds} seeds) |",
        "|---|---|---|",
    ]
    for config, figures in configurations.items():
        label = f"**{config}**" if config == head else config
        lines.append(f"| {label} | {cell(figures, 'greedy')} | {cell(figures, 'sampled')} |")
    lines.append(
        "\nAccuracy is exact match at `flowlearn eval`'s defaults (10 turns, the untrained "
        "engine), with a 95% interval (Wilson's greedy; a bootstrap over questions sampled), "
        "in percent; a gain's interval is a paired bootstrap over questions; an untrained "
        "configuration marked 'at most' ran only some of its questions, and even with every "
        "question left right it could not pass one run in full, so it cannot be the strongest: "
        "its figure is that ceiling; "
        f"{machine(data)}; {finished(data)}; built {data['date'][:10]} at commit "
        f"`{data['commit'][:10]}`."
    )
    return "\n".join(lines) + "\n"


def finished(data: dict[str, Any]) -> str:
    """When the runs behind the learning figures ended (they resume across sessions)."""
    entries = data["configurations"].values()
    ends = sorted(end for entry in entries for end in entry.get("finished", {}).values())
    if not ends:
        return "no run finished"
    return f"runs finished {ends[0][:16]} to {ends[-1][:16]}"


def render(text: str) -> str:
    """`text` with every bench table rewritten from its result files."""
    return BLOCK.sub(
        lambda found: (
            found[1]
            + (
                learning(found[2].split()[1])
                if found[2].startswith("learning ")
                else table(found[2].split())
            )
            + found[4]
        ),
        text,
    )


def present(text: str) -> str:
    """`text` with the tables whose result files all exist rewritten (the rest left as they are)."""

    def one(found: re.Match[str]) -> str:
        names = [name for name in found[2].split() if name != "learning"]
        missing = [name for name in names if not (RESULTS / name).is_file()]
        if missing:
            print(f"kept a table: {', '.join(missing)} not in bench/results/ yet")
            return found[0]
        return render(found[0])

    return BLOCK.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report differences, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for doc in DOCS:
        text = doc.read_text()
        new = render(text) if args.check else present(text)
        if new != text:
            stale.append(doc.relative_to(ROOT))
            if not args.check:
                doc.write_text(new)
    verb = "differ from" if args.check else "rewritten from"
    print(f"{', '.join(map(str, stale)) or 'no table'} {verb} bench/results/")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
