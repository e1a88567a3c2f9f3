"""The verifier's follow-up written or chosen: replay recorded follow-ups as a forced choice.

Reads saved eval trajectories (`flowlearn eval --save FILE`), takes every verifier follow-up call
(the second verifier transition of a turn: the reply so far and `Conclusion:`), and asks the
embedded SmolLM2 engine to choose between " STOP" and " CONTINUE" there by its scores
(the smollm2 preset's `VERDICT_CHOICES`, `choices.choice_logprobs`), as the verifier does since
session 26.
Prints, per file, how the written verdict (STOP, CONTINUE, or none: the reply began a new line)
meets the chosen one, and the follow-ups with no written verdict.

Session 25's trajectories, written before the change
(`research/smollm2-preset/results/verifier_choice.txt`).
Run: `python research/smollm2-preset/verifier_choice.py runs/s25-*.traj.jsonl`.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from flowlearn.engine import HFPolicy
from flowlearn.engine.local import choice_logprobs
from flowlearn.nodes.parsing import parse_verdict
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS

VERDICT_CHOICES = SMOLLM2_PROMPTS.verdict_choices
"""The verifier's follow-up choices in the embedded model's prompt set."""


def follow_ups(path: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Return (case, follow-up transition) for every verifier follow-up in a trajectory file."""
    found = []
    for line in path.read_text().splitlines():
        case = json.loads(line)
        turns: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for t in case["transitions"]:
            if t["node"] == "verifier":
                turns[t["turn"]].append(t)
        found += [(case, calls[1]) for calls in turns.values() if len(calls) > 1]
    return found


def main() -> None:
    """Replay each file's follow-ups; print the written-against-chosen counts."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trajectories", nargs="+", type=Path)
    args = parser.parse_args()
    policy = HFPolicy.from_pretrained(None)
    for path in args.trajectories:
        met: Counter[tuple[str, str]] = Counter()
        unwritten = []
        for case, call in follow_ups(path):
            verdict, clear = parse_verdict(call["output"])
            written = verdict if clear else "none"
            scores = choice_logprobs(policy, call["messages"], VERDICT_CHOICES)
            chosen = VERDICT_CHOICES[scores.index(max(scores))].strip()
            met[(written, chosen)] += 1
            if written == "none":
                unwritten.append(
                    f"  {case['id']} turn {call['turn']} (score {case['score']}): chose {chosen} "
                    f"({scores[0]:.2f} / {scores[1]:.2f}), {case['turn']} turns taken"
                )
        counts = ", ".join(f"written {w} -> chosen {c}: {n}" for (w, c), n in sorted(met.items()))
        print(f"{path.name}: {sum(met.values())} follow-ups; {counts}")
        print("\n".join(unwritten))


if __name__ == "__main__":
    main()
