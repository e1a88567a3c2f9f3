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
favours the baseline), with a paired bootstrap interval over questions.

The AgentFlow prompts are slow on the 135M model (each question runs all 10 turns, about 2.5
CPU-minutes a question on 2 cores, against about 10 minutes for a whole greedy run of the
`smollm2` prompts). So an untrained configuration runs `CHUNK` questions per run at a time and
stops once, with every question left to run right, its mean accuracy still could not pass an
untrained configuration measured in full: it cannot be the strongest baseline, so the headline
does not depend on its rest. Its figure is that ceiling, an upper bound (`--no-curtail` runs it
to the end). The shipped planner's runs always run to the end. Writes
bench/results/learning.json (every run's per-question scores) and the runs under `--work`.
"""

from __future__ import annotations

import argparse
import functools
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
CHUNK = 16
"""Questions per run between two curtailment checks: `--concurrency`, one batch of flows."""


def folder(work: Path, key: str, seed: int | None) -> Path:
    return work / f"{key}-{'greedy' if seed is None else f'seed{seed}'}"


@functools.cache
def question_ids(cases: int) -> frozenset[str]:
    """The ids of the test split's first `cases` questions, the ones `--limit cases` runs."""
    with TEST_FILE.open() as lines:
        return frozenset([json.loads(line)["id"] for line in lines][:cases])


def scores(work: Path, key: str, seed: int | None, cases: int) -> dict[str, float]:
    """A run's per-question scores so far among the first `cases` questions (empty before it
    starts; torn lines skipped; questions past `cases`, from a longer run, left out)."""
    results = folder(work, key, seed) / "results.jsonl"
    if not results.is_file():
        return {}
    wanted = question_ids(cases)
    return {row.id: float(row.score) for row in read_results(results) if row.id in wanted}


def finished(work: Path, key: str, seed: int | None, cases: int) -> dict[str, float] | None:
    """A finished run's per-question scores, or None (absent, or cut short)."""
    found = scores(work, key, seed, cases)
    return found if len(found) == cases else None


def ceiling(runs: list[dict[str, float]], cases: int) -> float:
    """The best mean accuracy `runs` can still reach: every question not yet run, right."""
    right = sum(sum(run.values()) for run in runs)
    return (right + sum(cases - len(run) for run in runs)) / (cases * len(runs))


def strongest_other(
    work: Path, key: str, seeds: list[int | None], cases: int
) -> tuple[str, float] | None:
    """The most accurate untrained configuration other than `key` measured in full at `seeds`
    (`[None]`: greedy), with its accuracy; None before one is."""
    best: tuple[str, float] | None = None
    for other in UNTRAINED:
        runs = [finished(work, other, seed, cases) for seed in seeds]
        if other == key or any(run is None for run in runs):
            continue
        accuracy = statistics.mean(statistics.mean(run.values()) for run in runs if run)
        if best is None or accuracy > best[1]:
            best = (other, accuracy)
    return best


def rival_of(
    work: Path, key: str, seeds: list[int | None], cases: int, curtail: bool
) -> tuple[str, float] | None:
    """With `curtail`, the untrained configuration measured in full that `key` must pass to be
    the strongest baseline (`strongest_other`); None without it, and for the shipped planner,
    which always runs to the end."""
    return strongest_other(work, key, seeds, cases) if curtail and key in UNTRAINED else None


def cannot_pass(runs: list[dict[str, float]], cases: int, rival: tuple[str, float] | None) -> bool:
    """Whether `runs` could not pass `rival` even with every question left right."""
    return rival is not None and ceiling(runs, cases) < rival[1]


def measure(
    work: Path, key: str, seeds: list[int | None], cases: int, curtail: bool
) -> tuple[str, float] | None:
    """Runs configuration `key` at `seeds` (`[None]`: greedy) to the end; returns None then.

    With `curtail`, an untrained configuration runs `CHUNK` more questions per run at a time,
    and stops once even every remaining question right could not lift its mean accuracy to an
    untrained configuration measured in full: it cannot be the strongest baseline, whatever
    the rest would show. Returns that configuration and its accuracy.
    """
    last: list[dict[str, float]] | None = None
    while True:
        runs = [scores(work, key, seed, cases) for seed in seeds]
        if all(len(run) == cases for run in runs):
            return None
        if runs == last:
            raise SystemExit(f"{CONFIGS[key][0]}: an eval run added no question; see its folder")
        last = runs
        rival = rival_of(work, key, seeds, cases, curtail)
        if cannot_pass(runs, cases, rival):
            return rival
        # a chunk more while there is a rival to compare with after it, else to the end
        limit = cases if rival is None else min(cases, min(map(len, runs)) + CHUNK)
        for seed, run in zip(seeds, runs, strict=True):
            if len(run) < limit:
                print(f"{CONFIGS[key][0]}, {'greedy' if seed is None else f'seed {seed}'} ...")
                eval_run(work, key, seed, limit)


def commits_file(run: Path) -> Path:
    """Where the commits a run's parts ran at are kept: beside its folder, which `flowlearn
    eval` keeps for its own files."""
    return run.with_name(run.name + ".commits.txt")


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
    out.parent.mkdir(parents=True, exist_ok=True)
    with commits_file(out).open("a") as log:  # a run may resume on newer code: each part's
        log.write(f"{provenance('learning.py')['commit']} {time.strftime('%F %T')} {limit}\n")
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


def entry(work: Path, key: str, seeds: list[int], cases: int, curtail: bool) -> dict[str, Any]:
    """Configuration `key`'s figures, greedy and sampled, from its runs' files: accuracy for a
    decoding whose runs all finished; for one stopped early (`measure`), its ceiling."""
    planner, prompts, analysis = CONFIGS[key][1]
    found: dict[str, Any] = {
        "key": key,
        "planner": planner,
        "prompts": prompts,
        "query_analysis": analysis,
        "per_question": {},
        "finished": {  # the runs resume across sessions: when each one ended
            folder(work, key, seed).name: ended(folder(work, key, seed))
            for seed in [None, *seeds]
            if finished(work, key, seed, cases) is not None
        },
    }
    found["commits"] = sorted(  # the commits its runs' parts ran at (runs resume on newer code;
        {  # parts run before bench/learning.py logged them in `commits_file` are not listed)
            line.split()[0]
            for seed in [None, *seeds]
            if commits_file(folder(work, key, seed)).is_file()
            for line in commits_file(folder(work, key, seed)).read_text().splitlines()
            if line.strip()
        }
    )
    for decoding, runs in (("greedy", [None]), ("sampled", [*seeds])):
        done = [finished(work, key, seed, cases) for seed in runs]
        if all(run is not None for run in done):
            complete = [run for run in done if run is not None]
            found[decoding] = summary(complete, greedy=decoding == "greedy")
            found["per_question"][decoding] = per_question(complete)
            continue
        partial = [scores(work, key, seed, cases) for seed in runs]
        rival = rival_of(work, key, runs, cases, curtail)
        if rival is not None and cannot_pass(partial, cases, rival):
            found[decoding] = {
                "ceiling": round(100 * ceiling(partial, cases), 1),
                "right": round(sum(sum(run.values()) for run in partial), 2),
                "questions_run": sum(len(run) for run in partial),
                "of": cases * len(runs),
                "below": CONFIGS[rival[0]][0],
                "below_accuracy": round(100 * rival[1], 1),
            }
            found["stopped"] = found.get("stopped", {}) | {
                folder(work, key, seed).name: ended(folder(work, key, seed))
                for seed in runs
                if scores(work, key, seed, cases)
            }
    return found


def figures(work: Path, seeds: list[int], cases: int, curtail: bool) -> dict[str, Any]:
    """Every configuration's figures, and the shipped planner's gain over the strongest
    untrained configuration measured in full, greedy and sampled (a paired bootstrap)."""
    configurations = {CONFIGS[key][0]: entry(work, key, seeds, cases, curtail) for key in CONFIGS}
    result: dict[str, Any] = {
        "cases": cases,
        "configurations": configurations,
        "not_measured": [
            f"{name}, {decoding}"
            for name, found in configurations.items()
            for decoding in ("greedy", "sampled")
            if decoding not in found
        ],
    }
    head = CONFIGS[HEADLINE][0]
    for decoding in ("greedy", "sampled"):
        names = [CONFIGS[key][0] for key in UNTRAINED]
        measured = [n for n in names if "accuracy" in configurations[n].get(decoding, {})]
        if decoding not in configurations[head] or not measured:
            continue
        strongest = max(measured, key=lambda name: configurations[name][decoding]["accuracy"])
        trained = configurations[head]["per_question"][decoding]
        baseline = configurations[strongest]["per_question"][decoding]
        result[f"gain_{decoding}"] = {
            "over": strongest,
            "untrained_measured": measured,
            "untrained_stopped": [
                n for n in names if "ceiling" in configurations[n].get(decoding, {})
            ],
            **gain(trained, baseline),
        }
    return result


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
    parser.add_argument(
        "--no-curtail",
        dest="curtail",
        action="store_false",
        help="run every untrained configuration to the end, even once it cannot be the strongest",
    )
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
    plan: list[tuple[str, list[int | None]]] = [(key, [None]) for key in keys(args.greedy)]
    plan += [(key, [*seeds]) for key in keys(args.sampled)]
    for key, runs in plan:
        rival = measure(args.work, key, runs, cases, curtail=args.curtail)
        if rival is not None:
            decoding = "greedy" if runs == [None] else "sampled"
            print(f"{CONFIGS[key][0]}, {decoding}: stopped, it cannot pass {CONFIGS[rival[0]][0]}")
    result: dict[str, Any] = provenance("learning.py", argv) | {
        "kind": "learning",
        "split": {"file": str(TEST_FILE.relative_to(RESULTS.parents[1])), "sha256": digest},
        "settings": {
            "seeds": args.seeds,
            "temperature": 0.7,
            "max_turns": 10,
            "limit": args.limit,
            "curtail": args.curtail,
        },
    }
    result |= figures(args.work, seeds, cases, curtail=args.curtail)
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
