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
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from measure import RESULTS, provenance, write_result

from flowlearn.evals.harness import read_results
from flowlearn.evals.reports import wilson_interval
from flowlearn.evals.tool_task import TEST_CORPUS_FILE, TEST_FILE, TEST_SHA256

BASE, TRAINED = "default-base", "default"
UNTRAINED = {  # key: (name, (planner, prompt set, query analysis))
    "base-smollm2-off": ("untrained, smollm2 prompts, analysis off", (BASE, "smollm2", False)),
    "base-smollm2-on": ("untrained, smollm2 prompts, analysis on", (BASE, "smollm2", True)),
    "base-agentflow-on": ("untrained, agentflow prompts, analysis on", (BASE, "agentflow", True)),
    "base-agentflow-off": (
        "untrained, agentflow prompts, analysis off",
        (BASE, "agentflow", False),
    ),
}
SHIPPED = {
    "shipped": (
        "shipped, its defaults (smollm2 prompts, analysis off)",
        (TRAINED, "smollm2", False),
    ),
    "shipped-analysis-on": ("shipped, analysis on", (TRAINED, "smollm2", True)),
}
CONFIGS = {**UNTRAINED, **SHIPPED}
HEADLINE = "shipped"
BOOTSTRAP = 4000


def folder(work: Path, key: str, seed: int | None) -> Path:
    return work / f"{key}-{'greedy' if seed is None else f'seed{seed}'}"


def finished(work: Path, key: str, seed: int | None, cases: int) -> dict[str, float] | None:
    """A finished run's per-question scores, or None (absent, or cut short)."""
    results = folder(work, key, seed) / "results.jsonl"
    if not results.is_file():
        return None
    scores = {row.id: float(row.score) for row in read_results(results)}  # torn lines skipped
    return scores if len(scores) == cases else None


def ended(run: Path) -> str:
    """When a finished run wrote its last result (its results file's modification time)."""
    stamp = (run / "results.jsonl").stat().st_mtime
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def eval_run(work: Path, key: str, seed: int | None, limit: int | None) -> None:
    """One `flowlearn eval` run at the configuration's defaults (resumed if it was cut short)."""
    planner, prompts, analysis = CONFIGS[key][1]
    out = folder(work, key, seed)
    command = [sys.executable, "-m", "flowlearn", "eval", "--data", str(TEST_FILE)]
    command += ["--scorer", "exact_match", "--corpus", str(TEST_CORPUS_FILE)]
    command += ["--concurrency", "16", "--planner", planner, "--prompts", prompts]
    command += ["--out", str(out)]
    command += ["--query-analysis" if analysis else "--no-query-analysis"]
    command += ["--temperature", "0"] if seed is None else ["--temperature", "0.7"]
    command += [] if seed is None else ["--seed", str(seed)]
    command += [] if limit is None else ["--limit", str(limit)]
    began = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    print(f"  {out.name}: {time.perf_counter() - began:.0f} s", flush=True)


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
        "ci95": [round(100 * x, 1) for x in wilson_interval(sum(scores.values()), len(scores))]
        if greedy
        else bootstrap(list(scores.values())),
        "runs": [round(100 * statistics.mean(run.values()), 1) for run in runs],
    }


def gain(trained: dict[str, float], baseline: dict[str, float]) -> dict[str, Any]:
    """Trained minus baseline, in points, with a paired bootstrap 95% interval over questions."""
    differences = [trained[q] - baseline[q] for q in trained]
    return {"points": round(100 * statistics.mean(differences), 1), "ci95": bootstrap(differences)}


def keys(text: str) -> list[str]:
    found = [key.strip() for key in text.split(",") if key.strip()]
    unknown = sorted(set(found) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; the keys are {', '.join(CONFIGS)}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    every = ",".join(CONFIGS)
    parser.add_argument("--greedy", default=every, help=f"configurations run greedy ({every})")
    parser.add_argument("--sampled", default=every, help="configurations run sampled (all)")
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
    seeds = list(range(1, args.seeds + 1))
    cases = args.limit or sum(1 for _ in TEST_FILE.open())
    plan = [(key, None) for key in keys(args.greedy)]
    plan += [(key, seed) for key in keys(args.sampled) for seed in seeds]
    for key, seed in plan:
        if finished(args.work, key, seed, cases) is None:
            print(f"{CONFIGS[key][0]}, {'greedy' if seed is None else f'seed {seed}'} ...")
            eval_run(args.work, key, seed, args.limit)
    result: dict[str, Any] = provenance("learning.py", argv) | {
        "kind": "learning",
        "split": {"file": str(TEST_FILE.relative_to(RESULTS.parents[1])), "sha256": digest},
        "settings": {"seeds": args.seeds, "temperature": 0.7, "max_turns": 10, "limit": args.limit},
        "cases": cases,
        "configurations": {},
        "not_measured": [],
    }
    for key, (name, (planner, prompts, analysis)) in CONFIGS.items():
        greedy = finished(args.work, key, None, cases)
        sampled = [finished(args.work, key, seed, cases) for seed in seeds]
        entry: dict[str, Any] = {
            "key": key,
            "planner": planner,
            "prompts": prompts,
            "query_analysis": analysis,
            "per_question": {},
        }
        entry["finished"] = {  # the runs resume across sessions: when each one ended
            folder(args.work, key, seed).name: ended(folder(args.work, key, seed))
            for seed in [None, *seeds]
            if finished(args.work, key, seed, cases) is not None
        }
        if greedy is not None:
            entry["greedy"] = summary([greedy], greedy=True)
            entry["per_question"]["greedy"] = greedy
        if all(run is not None for run in sampled):
            runs = [run for run in sampled if run is not None]
            entry["sampled"] = summary(runs, greedy=False)
            entry["per_question"]["sampled"] = per_question(runs)
        result["not_measured"] += [
            f"{name}, {decoding}" for decoding in ("greedy", "sampled") if decoding not in entry
        ]
        result["configurations"][name] = entry
    configurations = result["configurations"]
    head = CONFIGS[HEADLINE][0]
    for decoding in ("greedy", "sampled"):
        measured = [CONFIGS[k][0] for k in UNTRAINED if decoding in configurations[CONFIGS[k][0]]]
        if decoding not in configurations[head] or not measured:
            continue
        strongest = max(measured, key=lambda name: configurations[name][decoding]["accuracy"])
        trained = configurations[head]["per_question"][decoding]
        baseline = configurations[strongest]["per_question"][decoding]
        result[f"gain_{decoding}"] = {
            "over": strongest,
            "untrained_measured": measured,
            **gain(trained, baseline),
        }
    write_result(args.out, result)
    for decoding in ("greedy", "sampled"):
        if f"gain_{decoding}" in result:
            found = result[f"gain_{decoding}"]
            print(f"{decoding}: shipped over '{found['over']}': {found['points']:+.1f} points "
                  f"(95% CI {found['ci95'][0]:+.1f} to {found['ci95'][1]:+.1f})")  # fmt: skip
    if result["not_measured"]:
        print("not measured yet: " + "; ".join(result["not_measured"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
