"""The before/after table of the default planner on the held-out tool-use questions.

Reads two `flowlearn eval` output folders (their `results.jsonl`), the untrained planner's and
the trained one's, run on `evals/data/tooluse/heldout.jsonl` with the same settings, and prints
and writes, per planner: accuracy, the planner's format-error rate, and how often its first tool
was the right one for the question's kind (`python` for arithmetic, `local_search` for lookups).

    flowlearn eval --data evals/data/tooluse/heldout.jsonl --scorer exact_match \\
        --corpus evals/data/tooluse/corpus.jsonl --temperature 0 --max-turns 1 \\
        --concurrency 16 --planner default-base --out runs/eval-base
    (the same with --planner default --out runs/eval-trained)
    python research/default-planner/learn_tools_report.py runs/eval-base runs/eval-trained

Writes research/default-planner/results/learn_tools.{json,md} (`--out NAME`: NAME.{json,md}).
`--cases` names
another tool-use set (cases with `id` and `tool`), e.g.
`research/default-planner/outside_set.py`'s. Each answer
is scored again with `exact_match`, the task's scorer, so an eval run before a scorer fix
reads as the scorer reads it now.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from flowlearn.evals.scorers import exact_match
from flowlearn.evals.tool_task import HELDOUT_FILE

RESULTS = Path(__file__).parent / "results"


def measure(folder: Path, expected: dict[str, str]) -> dict[str, Any]:
    """Summarise one eval folder against each case's expected tool."""
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    turns = sum(max(r["turns"], 1) for r in rows)
    right_tool = [bool(r["tools"]) and r["tools"][0] == expected[r["id"]] for r in rows]
    scores = [exact_match(r["answer"], r["reference"]).value for r in rows]
    return {
        "cases": len(rows),
        "accuracy": round(sum(scores) / len(rows), 4),
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


def table(before: dict[str, Any], after: dict[str, Any], name: str = "held-out") -> str:
    """Render the two summaries as a markdown table."""
    lines = [
        f"| {name} ({before['cases']}) | untrained planner | trained planner |",
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
    parser.add_argument("--cases", type=Path, default=HELDOUT_FILE, help="the evals' cases")
    parser.add_argument(
        "--out", default="learn_tools", help="file name under research/default-planner/results/"
    )
    args = parser.parse_args(argv)
    cases = [json.loads(line) for line in args.cases.read_text().splitlines()]
    expected = {c["id"]: c["tool"] for c in cases}
    before, after = measure(args.before, expected), measure(args.after, expected)
    name = "held-out" if args.cases == HELDOUT_FILE else args.cases.parent.name
    text = table(before, after, name)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{args.out}.md").write_text(text + "\n")
    summary = {"untrained": before, "trained": after}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
