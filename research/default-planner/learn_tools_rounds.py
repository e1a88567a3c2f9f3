"""Per round of a learn_tools training run: what the planner chose and what it earned.

Reads a run's `rollouts.jsonl` (`flowlearn train --config examples/learn_tools.yaml`) and
prints, per round of rollouts: the questions' kinds, plans that chose the right tool (python
for arithmetic, local_search for lookups) per kind, format errors, right answers, and the most
common sub-goal.

Run: `python research/default-planner/learn_tools_rounds.py runs/learn-tools`.
"""

from __future__ import annotations

import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

RIGHT_TOOL = {"math": "python", "fact": "local_search"}
"""The tool each kind needs, by the kind in the task's ids (`train-math-3`, `train-fact-3`)."""


def round_of(rollout: dict[str, Any]) -> int:
    """The rollout's round: the step in its id (`step4:train-math-2/1@run`)."""
    return int(rollout["trajectory_id"].split(":", 1)[0].removeprefix("step"))


def summary(rollouts: list[dict[str, Any]]) -> str:
    """One line: per kind, right first tools and right answers; format errors; top sub-goal."""
    kinds: dict[str, Counter[str]] = defaultdict(Counter)
    sub_goals: Counter[str] = Counter()
    for rollout in rollouts:
        kind = rollout["group_id"].split("-")[1]
        counts = kinds[kind]
        counts["n"] += 1
        first = rollout["memory"][0] if rollout["memory"] else {}
        counts["format errors"] += first.get("kind") == "format_error"
        counts["right tool"] += first.get("tool") == RIGHT_TOOL.get(kind)
        counts["right"] += rollout["reward"] > 0
        if first.get("sub_goal"):
            sub_goals[first["sub_goal"]] += 1
    parts = [
        f"{kind} {c['right tool']}/{c['n']} tool, {c['right']} right, {c['format errors']} fmt"
        for kind, c in sorted(kinds.items())
    ]
    top = sub_goals.most_common(1)
    common = f"; top sub-goal {top[0][1]}x {top[0][0]!r}" if top else ""
    return f"n={len(rollouts)}: " + "; ".join(parts) + common


def main(folder: str) -> None:
    """Print one line per round of the run in `folder`."""
    lines = Path(folder, "rollouts.jsonl").read_text().splitlines()
    rounds: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for line in lines:
        rollout = json.loads(line)
        rounds[round_of(rollout)].append(rollout)
    for step in sorted(rounds):
        print(f"step{step}: {summary(rounds[step])}")


if __name__ == "__main__":
    main(sys.argv[1])
