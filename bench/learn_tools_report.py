"""The before/after table of the default planner on the held-out tool-use questions.

Reads two `flowlearn eval` output folders (their `results.jsonl`), the untrained planner's and
the trained one's, run on `evals/data/tooluse/heldout.jsonl` with the same settings, and prints
and writes, per planner: accuracy, the planner's format-error rate, and how often its first tool
was the right one for the question's kind (`python` for arithmetic, `local_search` for lookups).

    flowlearn eval --data evals/data/tooluse/heldout.jsonl --scorer exact_match \\
        --corpus evals/data/tooluse/corpus.jsonl --temperature 0 --max-turns 1 \\
        --concurrency 16 --planner default-base --out runs/eval-base
    (the same with --planner default --out runs/eval-trained)
    python bench/learn_tools_report.py runs/eval-base runs/eval-trained

Writes bench/results/learn_tools.{json,md}.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from flowlearn.evals.tool_task import HELDOUT_FILE

RESULTS = Path(__file__).parent / "results"


def measure(folder: Path, expected: dict[str, str]) -> dict[str, Any]:
    """Summarise one eval folder against each case's expected tool."""
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    turns = sum(max(r["turns"], 1) for r in rows)
    right_tool = [bool(r["tools"]) and r["tools"][0] == expected[r["id"]] for r in rows]
    return {
        "cases": len(rows),
        "accuracy": round(sum(r["score"] for r in rows) / len(rows), 4),
        "format_error_rate": round(sum(r["format_errors"] for r in rows) / turns, 4),
        "right_tool_rate": round(sum(right_tool) / len(rows), 4),
        "by_kind": {
            kind: round(
                sum(ok for r, ok in zip(rows, right_tool, strict=True) if expected[r["id"]] == kind)
                / max(1, sum(expected[r["id"]] == kind for r in rows)),
                4,
            )
            for kind in sorted(set(expected.values()))
        },
    }


def table(before: dict[str, Any], after: dict[str, Any]) -> str:
    """Render the two summaries as a markdown table."""
    lines = [
        "| held-out (48) | untrained planner | trained planner |",
        "|---|---|---|",
        f"| accuracy (exact match) | {100 * before['accuracy']:.1f}% | "
        f"{100 * after['accuracy']:.1f}% |",
        f"| planner format errors (of turns) | {100 * before['format_error_rate']:.1f}% | "
        f"{100 * after['format_error_rate']:.1f}% |",
        f"| first tool right for the question | {100 * before['right_tool_rate']:.1f}% | "
        f"{100 * after['right_tool_rate']:.1f}% |",
    ]
    for kind in before["by_kind"]:
        lines.append(
            f"| ... questions needing `{kind}` | {100 * before['by_kind'][kind]:.1f}% | "
            f"{100 * after['by_kind'][kind]:.1f}% |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Compare the two eval folders; print and write the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path, help="eval folder of the untrained planner")
    parser.add_argument("after", type=Path, help="eval folder of the trained planner")
    args = parser.parse_args(argv)
    cases = [json.loads(line) for line in HELDOUT_FILE.read_text().splitlines()]
    expected = {c["id"]: c["tool"] for c in cases}
    before, after = measure(args.before, expected), measure(args.after, expected)
    text = table(before, after)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "learn_tools.md").write_text(text + "\n")
    summary = {"untrained": before, "trained": after}
    (RESULTS / "learn_tools.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
