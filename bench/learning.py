"""Does training help? The shipped planner against every untrained configuration, on the test split.

Run: `python bench/learning.py` (`make bench-learning`; a few hours on 2 CPU cores). Every
configuration a user can pick for the embedded model runs `flowlearn eval` at its defaults
(10 turns, the untrained engine) on the tool task's test split (`evals/data/tooluse/test.jsonl`,
written before any model read it, its SHA-256 recorded beside the figures):

- untrained (`default-base`): both prompt sets (`smollm2`, `agentflow`), each with the engine's
  query analysis on and off;
- shipped (`default`): at its own defaults, and with the query analysis on (a setting its preset
  could choose instead).

Each runs greedy (how `flowlearn eval` runs by default) and sampled at T=0.7 (how training
samples, and how AgentFlow evaluates) with `--seeds` seeds. Accuracy comes with a 95% interval:
Wilson's for one greedy run, a bootstrap over questions for the mean of the sampled runs. The
headline gain is the shipped planner at its defaults over the STRONGEST untrained configuration
(the best one on this split, greedy and sampled each: a baseline chosen after the fact, which
favours the baseline), with a paired bootstrap interval over questions. Writes
bench/results/learning.json (every run's per-question scores) and the runs under `--work`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from measure import RESULTS, provenance, write_result

from flowlearn.evals.tool_task import TEST_CORPUS_FILE, TEST_FILE, TEST_SHA256

UNTRAINED = {
    "untrained, smollm2 prompts, analysis off": ("default-base", "smollm2", False),
    "untrained, smollm2 prompts, analysis on": ("default-base", "smollm2", True),
    "untrained, agentflow prompts, analysis on": ("default-base", "agentflow", True),
    "untrained, agentflow prompts, analysis off": ("default-base", "agentflow", False),
}
SHIPPED = {
    "shipped, its defaults (smollm2 prompts, analysis off)": ("default", "smollm2", False),
    "shipped, analysis on": ("default", "smollm2", True),
}
HEADLINE = next(iter(SHIPPED))
BOOTSTRAP = 4000


def eval_run(
    work: Path, name: str, setting: tuple[str, str, bool], seed: int | None, limit: int | None
) -> dict[str, float]:
    """One `flowlearn eval` run (resumed if its folder holds results); per-question scores."""
    planner, prompts, analysis = setting
    slug = name.replace(", ", "-").replace(" ", "_").replace("(", "").replace(")", "")
    out = work / f"{slug}-{'greedy' if seed is None else f'seed{seed}'}"
    command = [sys.executable, "-m", "flowlearn", "eval", "--data", str(TEST_FILE)]
    command += ["--scorer", "exact_match", "--corpus", str(TEST_CORPUS_FILE)]
    command += [
        "--concurrency",
        "16",
        "--planner",
        planner,
        "--prompts",
        prompts,
        "--out",
        str(out),
    ]
    command += ["--query-analysis" if analysis else "--no-query-analysis"]
    command += ["--temperature", "0"] if seed is None else ["--temperature", "0.7"]
    command += [] if seed is None else ["--seed", str(seed)]
    command += [] if limit is None else ["--limit", str(limit)]
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    scores = {}
    for line in (out / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        scores[row["id"]] = float(row["score"])
    print(f"  {out.name}: {100 * statistics.mean(scores.values()):.1f}% "
          f"({time.perf_counter() - began:.0f} s)", flush=True)  # fmt: skip
    return scores


def wilson(successes: float, n: int, z: float = 1.96) -> list[float]:
    """Wilson's 95% interval of a proportion, in points."""
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return [round(100 * (centre - half), 1), round(100 * (centre + half), 1)]


def bootstrap(values: list[float], seed: int = 0) -> list[float]:
    """A 95% percentile interval of the mean of `values` (per question), in points."""
    rng = random.Random(seed)
    means = sorted(statistics.mean(rng.choices(values, k=len(values))) for _ in range(BOOTSTRAP))
    return [
        round(100 * means[int(0.025 * BOOTSTRAP)], 1),
        round(100 * means[int(0.975 * BOOTSTRAP)], 1),
    ]


def per_question(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each question's mean score over `runs`."""
    return {q: statistics.mean(run[q] for run in runs) for q in runs[0]}


def summary(runs: list[dict[str, float]], greedy: bool) -> dict[str, Any]:
    scores = per_question(runs)
    accuracy = statistics.mean(scores.values())
    return {
        "accuracy": round(100 * accuracy, 1),
        "ci95": wilson(sum(scores.values()), len(scores))
        if greedy
        else bootstrap(list(scores.values())),
        "runs": [round(100 * statistics.mean(run.values()), 1) for run in runs],
    }


def gain(trained: dict[str, float], baseline: dict[str, float]) -> dict[str, Any]:
    """Trained minus baseline, in points, with a paired bootstrap 95% interval over questions."""
    differences = [trained[q] - baseline[q] for q in trained]
    return {"points": round(100 * statistics.mean(differences), 1), "ci95": bootstrap(differences)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="sampled runs per configuration (3)")
    parser.add_argument("--limit", type=int, help="the first N test questions (a smoke run)")
    parser.add_argument("--work", type=Path, default=Path("runs/bench-learning"))
    parser.add_argument("--out", type=Path, default=RESULTS / "learning.json")
    args = parser.parse_args(argv)
    if args.seeds < 3:
        parser.error("--seeds must be >= 3: a sampled figure is a mean over at least 3 seeds")
    digest = hashlib.sha256(TEST_FILE.read_bytes()).hexdigest()
    if digest != TEST_SHA256:
        raise SystemExit(f"{TEST_FILE} changed since it was recorded: it is no longer held out")
    result: dict[str, Any] = provenance("learning.py", argv) | {
        "kind": "learning",
        "split": {"file": str(TEST_FILE.relative_to(RESULTS.parents[1])), "sha256": digest},
        "settings": {"seeds": args.seeds, "temperature": 0.7, "max_turns": 10, "limit": args.limit},
        "configurations": {},
    }
    seeds = list(range(1, args.seeds + 1))
    scores: dict[str, dict[str, Any]] = {}
    for name, setting in {**UNTRAINED, **SHIPPED}.items():
        print(f"{name}: greedy and {len(seeds)} sampled runs ...", flush=True)
        greedy = eval_run(args.work, name, setting, None, args.limit)
        sampled = [eval_run(args.work, name, setting, seed, args.limit) for seed in seeds]
        scores[name] = {"greedy": greedy, "sampled": sampled}
        planner, prompts, analysis = setting
        result["configurations"][name] = {
            "planner": planner,
            "prompts": prompts,
            "query_analysis": analysis,
            "greedy": summary([greedy], greedy=True),
            "sampled": summary(sampled, greedy=False),
            "per_question": {"greedy": greedy, "sampled": per_question(sampled)},
        }
        write_result(args.out, result)  # what finished, should a later run fail
    configurations = result["configurations"]
    result["cases"] = len(scores[HEADLINE]["greedy"])
    for decoding in ("greedy", "sampled"):
        strongest = max(UNTRAINED, key=lambda name: configurations[name][decoding]["accuracy"])
        trained = configurations[HEADLINE]["per_question"][decoding]
        baseline = configurations[strongest]["per_question"][decoding]
        result[f"gain_{decoding}"] = {"over": strongest, **gain(trained, baseline)}
    write_result(args.out, result)
    for decoding in ("greedy", "sampled"):
        found = result[f"gain_{decoding}"]
        print(f"{decoding}: shipped over '{found['over']}': {found['points']:+.1f} points "
              f"(95% CI {found['ci95'][0]:+.1f} to {found['ci95'][1]:+.1f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
