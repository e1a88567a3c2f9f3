"""Batch building: 10k and 100k planner transitions to Flow-GRPO rows; seconds and the ratio.

Run: `python bench/batches.py`. Synthetic groups of G=8 trajectories with 1-3 planner turns of
realistic token counts (600 prompt, 120 completion ids). Target: linear (ratio about 10) and
under 5 s for 100k. Writes bench/results/batches.json.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

from flowlearn.training import Trajectory, Transition, build_flow_grpo_rows

RESULTS = Path(__file__).parent / "results" / "batches.json"


def trajectories(transitions: int, seed: int = 0) -> list[Trajectory]:
    rng = random.Random(seed)
    prompt = list(range(600))
    out: list[Trajectory] = []
    made = 0
    while made < transitions:
        group = f"g{len(out) // 8}"
        tid = f"{group}/{len(out) % 8}"
        turns = []
        for turn in range(1, rng.randint(1, 3) + 1):
            completion = [rng.randrange(50_000) for _ in range(120)]
            turns.append(
                Transition(
                    trajectory_id=tid,
                    group_id=group,
                    node="planner",
                    turn=turn,
                    messages=[],
                    output="",
                    parse_status="ok",
                    seconds=0.0,
                    prompt_ids=prompt,
                    completion_ids=completion,
                    logprobs=[-1.0] * 120,
                )
            )
        made += len(turns)
        out.append(
            Trajectory(tid, group, "q", "r", "a", "a", float(rng.random() < 0.5), transitions=turns)
        )
    return out


def measure(n: int) -> dict[str, float]:
    data = trajectories(n)
    start = time.perf_counter()
    batch = build_flow_grpo_rows(data, "paper")
    seconds = time.perf_counter() - start
    return {"transitions": n, "rows": len(batch.rows), "seconds": round(seconds, 3)}


def main() -> None:
    small, large = measure(10_000), measure(100_000)
    result = {
        "small": small,
        "large": large,
        "ratio_100k_over_10k": round(large["seconds"] / small["seconds"], 2),
    }
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
