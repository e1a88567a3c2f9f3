"""Batch building: 10k and 100k planner transitions to Flow-GRPO rows; seconds and the ratio.

Run: `python bench/batches.py [--small 10000] [--large 100000] [--repeats 3]`. Synthetic groups
of G=8 trajectories with 1-3 planner turns of realistic token counts (600 prompt, 120 completion
ids), built once per size, untimed. After an untimed warm-up of each size, `build_flow_grpo_rows`
runs `--repeats` times (3) on each, the sizes' order reversed every other repeat; the figures are
the median and min-max of the large size's seconds and of the pair ratios large/small (one a
repeat). Target: linear (ratio about 10) and under 5 s for 100k. Writes every repeat's seconds,
the provenance (commit, command, machine, load) and the `headlines` to
bench/results/batches.json (`--out`). About 25 s at the defaults on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from measure import (
    RESULTS,
    alternate,
    check_repeats,
    figure_line,
    headline,
    provenance,
    ratios,
    spread,
    write_result,
)

from flowlearn.training import Trajectory, Transition, build_flow_grpo_rows


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


def size_name(n: int) -> str:
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=10_000, help="transitions (10000)")
    parser.add_argument("--large", type=int, default=100_000, help="transitions (100000)")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each size (3)")
    parser.add_argument("--out", type=Path, default=RESULTS / "batches.json", help="JSON path")
    args = parser.parse_args(argv)
    check_repeats(args.repeats)
    if not 0 < args.small < args.large:
        parser.error("--small and --large: 0 < small < large")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    data = {n: trajectories(n) for n in (args.small, args.large)}
    made: dict[int, int] = {}

    def arm(n: int) -> float:
        start = time.perf_counter()
        batch = build_flow_grpo_rows(data[n], "paper")
        seconds = time.perf_counter() - start
        made[n] = len(batch.rows)
        return seconds

    def report(repeat: int, seconds: dict[str, float]) -> None:
        print(f"  repeat {repeat + 1}: " + ", ".join(f"{k} {v:.3f} s" for k, v in seconds.items()))

    small, large = size_name(args.small), size_name(args.large)
    print(f"{small} and {large} transitions, {args.repeats} repeats ...", flush=True)
    seconds = alternate(
        {small: lambda: arm(args.small), large: lambda: arm(args.large)},
        args.repeats,
        on_repeat=report,
    )
    ratio = ratios(seconds[large], seconds[small])
    result: dict[str, Any] = provenance("batches.py", argv) | {
        "settings": {"repeats": args.repeats, "group": 8, "prompt_ids": 600, "completion_ids": 120},
        "small": {"transitions": args.small, "rows": made[args.small]}
        | {"seconds": spread(seconds[small])},
        "large": {"transitions": args.large, "rows": made[args.large]}
        | {"seconds": spread(seconds[large])},
        f"ratio_{large}_over_{small}": ratio,
    }
    result["headlines"] = [
        headline(
            f"batch building, {large} transitions",
            result["large"]["seconds"],
            "s",
            f"{large} planner transitions turned into Flow-GRPO rows by build_flow_grpo_rows",
        ),
        headline(
            f"batch building, {large} over {small}",
            ratio,
            "x",
            f"the seconds for {large} transitions vs for {small}, timed in the same repeat",
        ),
    ]
    write_result(args.out, result)
    print(figure_line(f"{large}_seconds", result["large"]["seconds"]))
    print(figure_line(f"ratio_{large}_over_{small}", ratio) + f"; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
