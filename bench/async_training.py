"""Asynchronous Flow-GRPO against the synchronous loop: training steps per minute, tool waits.

Run: `python bench/async_training.py` (about 8 minutes on 2 CPU cores). Both arms train the
same planner from the same initial weights on the same questions, `--questions` x
`--generations` rollouts a step, with the same settings; the one difference is TRL's config's
`max_staleness`: 0 (the synchronous loop: roll out, then update) or 1 (a producer thread rolls
the next step out while the trainer updates, `flowlearn.training.producer`).

1. The work: the AgentFlow graph, 2 planner turns a rollout, each turn a `web_search` call to a
   stand-in of Tavily's API on 127.0.0.1 (bench/search_stand_in.py) that answers after
   `--search-latency` seconds (1.0; a real web search takes 1-2 s). The engine (analysis,
   tool arguments, verifier, answer) is scripted and instant; its verifier always says
   CONTINUE, so every rollout makes the same 2 planner calls and 2 searches, and every step
   trains on the same number of rows in both arms (zero-variance groups are kept, so no row
   count depends on the rewards). The reward is a coin flip (the scripted answer): this bench
   measures speed, and the coin keeps advantages non-zero so every update moves the weights.
2. The planner: a tiny random Qwen2 (`gpu_checks.TINY`, fp32, a tokenizer fitted to AgentFlow's
   templates), built locally, whose LM head has a fixed bias towards two added tokens, each a
   whole plan naming `web_search` with its own sub-goal (`PLANS`): every turn plans the search
   in one token, as a trained planner would, and still samples (which of the two), so its
   updates move real logprobs. Without the bias a random model never names a tool and no
   rollout waits on anything. One token a plan, not a token a line: with tied embeddings a
   random model's hidden state is mostly its last token's embedding, so it repeats that token
   (p about 0.85 at T=0.7), and a plan of two line-tokens ran to the 16-token budget without its
   second line in 1 turn of 10.
3. The machine: `torch.set_num_threads(1)` for the whole process, both arms, so the trainer
   (main thread) and the producer (its thread, decoding through `BatchingPolicy`'s worker) use
   one core each of the 2. Both arms run in this one process with the same CPU affinity
   (recorded); nothing is pinned.
4. The timing: each timed repeat trains a fresh trainer for `--steps` steps and times
   `trainer.train()` (steps per minute = steps x 60 / seconds). One untimed warm-up of each
   arm first, then `--repeats` (3) pairs, the arms alternating (`measure.alternate`). The
   figure is the median of the pair ratios async/sync with their range.

Where the limit is. With R a step's rollout (mostly its searches: 2 x latency) and U its
update, a synchronous step takes R + U and an asynchronous one max(R, U) (each overlaps the
other), so the ideal ratio is (R + U) / max(R, U): 2 when R = U, 1 + U/R when the rollout is the
longer. A run of S steps cannot overlap its first rollout or its last update, so it gets at most
S (R + U) / (R + U + (S - 1) max(R, U)) (1.85 at R = U and S = 12), less train()'s fixed cost
(setup, the final plot). The async arm also pays a no-grad forward over the stale rows (the
importance correction) and a weights copy each step, and its two threads share the GIL and the
2 cores: a busy machine takes the second core from the overlap (the load average at the start is
recorded). The defaults put R near U on this 2-core machine: R about 2.5 s, U about 0.16 s a row
(16 rows a step) at load 6 (from a `--smoke` run with 32 rows: R 2.65 s, U 5.1 s). The run
prints R and U as the synchronous arm measured them and the ratios they allow.

Results (commit, command line, machine, every repeat, the async arm's staleness, importance
ratios and waits) go to bench/results/async_training.json and .txt (`--out`). `--smoke` runs
fewer than 3 repeats to check the script (to a temporary file, never published). Last line:
`async_over_sync_steps_per_minute=<median> pairs=<n> range=<min>-<max>`.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from gpu_checks import TINY, model, tokenizer
from langchain_core.messages import AIMessage
from measure import (
    MIN_REPEATS,
    RESULTS,
    Report,
    alternate,
    check_repeats,
    figure_line,
    headline,
    provenance,
    ratios,
    spread,
)
from search_stand_in import DEFAULT_LATENCY, SearchStandIn, search_stand_in
from trl import GRPOConfig

from flowlearn.engine.scripted import ScriptedChatModel
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score, exact_match
from flowlearn.graphs import Context
from flowlearn.nodes.tools import web_search_tool
from flowlearn.training.trainer import FlowGRPOTrainer, read_metrics

TURNS = 2
"""Planner turns a rollout, each with one search (the verifier always says CONTINUE)."""
TOKENS = 16
"""The planner's completion budget (TRL's max_completion_length); a plan takes 1."""
TEMPERATURE = 0.7
PLANS = (
    "Tool Name: web_search\nSub-Goal: search the web for the answer\n",
    "Sub-Goal: look the fact up\nTool Name: web_search\n",
)
"""Two added tokens, each a complete plan (`parse_planner_output` reads fields in any order)."""
PLAN_BIAS = 12.0
"""The LM head's bias towards `PLANS`: at T=0.7 any other token of the 2,002 has a chance of
about 2000 x exp(-12 / 0.7) = 7e-5, so every plan names the search."""
ARMS = {"sync": 0, "async": 1}
"""Each arm's max_staleness."""
ASYNC_KEYS = (
    "flow/staleness",
    "flow/row_staleness_max",
    "flow/is_ratio_min",
    "flow/is_ratio_max",
    "flow/is_ratio_std",
    "flow/is_capped_share",
    "flow/trainer_wait_s",
    "flow/producer_wait_s",
    "flow/producer_rollout_s",
)
STEP_KEYS = ("flow/rollout_seconds", "flow/update_seconds", "flow/rows", *ASYNC_KEYS)


def plan_tokens(tok: Any) -> list[int]:
    """Add `PLANS` to `tok` as whole tokens (once) and return their ids."""
    tok.add_tokens([plan for plan in PLANS if plan not in tok.get_vocab()])
    return [tok.convert_tokens_to_ids(plan) for plan in PLANS]


def planner_model(tok: Any) -> Any:
    """The tiny random Qwen2 (seeded: the same weights each call), its head biased to the plan.

    The head stays tied to the input embeddings, as `TINY` ties them; the bias is frozen (a
    fixed preference, never trained) and is read by TRL's fused LM head as by generation.
    """
    built = model(TINY, tok, "cpu", torch.float32)
    head = torch.nn.Linear(built.config.hidden_size, built.config.vocab_size, bias=True)
    head.weight = built.get_input_embeddings().weight
    bias = torch.zeros(built.config.vocab_size)
    bias[plan_tokens(tok)] = PLAN_BIAS
    head.bias = torch.nn.Parameter(bias, requires_grad=False)
    built.lm_head = head
    return built


def scripted_engine(seed: int) -> ScriptedChatModel:
    """The fixed engine, instant: a search for every tool call, CONTINUE, a coin-flip answer."""
    coin, lock = random.Random(seed), threading.Lock()

    def respond(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        if tools:
            call = {"name": "web_search", "args": {"query": "capital of the country"}, "id": "1"}
            return AIMessage("", tool_calls=[call])
        prompt = str(messages[-1].content)
        if "Conclusion: CONTINUE" in prompt:  # the verifier: always another turn
            return "The memory is not enough yet.\nConclusion: CONTINUE"
        if "<answer>" in prompt:  # the generator
            with lock:
                return f"<answer>{coin.choice(['paris', 'rome'])}</answer>"
        return "Analysis: a fact to look up; web_search finds it."  # the query analysis

    return ScriptedChatModel(respond=respond)


def scorer(answer: str, case: Case) -> Score:
    return exact_match(answer, case.reference)


def questions(count: int) -> list[Case]:
    """`count` distinct questions: one epoch covers the whole run, so the producer's lookahead
    never meets an epoch's end (it reads ahead within an epoch only)."""
    return [Case(f"q{i}", f"What is the capital of country {i}?", "paris") for i in range(count)]


def trainer_for(args: argparse.Namespace, tok: Any, url: str, staleness: int, out: Path) -> Any:
    """A fresh trainer from the initial weights, `max_staleness` as the arm asks."""
    shutil.rmtree(out, ignore_errors=True)
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.questions * args.generations,
        num_generations=args.generations,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_steps=args.steps,
        learning_rate=1e-3,
        temperature=TEMPERATURE,
        loss_type="dapo",
        beta=0.0,
        max_completion_length=TOKENS,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        use_cpu=True,
        seed=0,
        bf16=False,
        disable_tqdm=True,
    )
    config.max_staleness = staleness  # type: ignore[attr-defined]
    context = Context(
        max_turns=TURNS, planner_temperature=TEMPERATURE, planner_max_new_tokens=TOKENS, seed=0
    )
    return FlowGRPOTrainer.online(
        planner_model(tok),
        args=config,
        engine=scripted_engine(seed=0),
        tools=[web_search_tool(api_key="bench", base_url=url)],
        scorer=scorer,
        cases=questions(args.questions * args.steps),
        context=context,
        processing_class=tok,
        drop_zero_variance=False,  # every group trains: the same rows in both arms
    )


def train_once(
    args: argparse.Namespace, tok: Any, server: SearchStandIn, arm: str, index: int
) -> dict[str, Any]:
    """Train one fresh trainer for `--steps` steps; its wall time, searches and step metrics."""
    out = args.work / f"{arm}-{index}"
    trainer = trainer_for(args, tok, server.url, ARMS[arm], out)
    gc.collect()
    server.reset()
    began = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - began
    records = [r for r in read_metrics(out / "metrics.jsonl") if "flow/rows" in r]
    steps = {key: [r[key] for r in records if key in r] for key in STEP_KEYS}
    del trainer
    gc.collect()
    expected = args.steps * args.questions * args.generations * TURNS
    if not server.queries:
        sys.exit(f"{arm}: the planner never named web_search; nothing waited on the tool")
    return {
        "seconds": seconds,
        "steps_per_minute": args.steps * 60 / seconds,
        "searches": len(server.queries),
        "searches_expected": expected,
        "peak_searches_in_flight": server.peak,
        "steps": steps,
    }


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def arm_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each step metric's mean over every step of the timed repeats, and the ratio's extremes."""
    pooled = {key: [v for run in runs for v in run["steps"][key]] for key in STEP_KEYS}
    summary = {key.removeprefix("flow/"): mean(values) for key, values in pooled.items()}
    if pooled["flow/is_ratio_min"]:
        summary["is_ratio_lowest"] = min(pooled["flow/is_ratio_min"])
        summary["is_ratio_highest"] = max(pooled["flow/is_ratio_max"])
    summary["rows_per_step"] = sorted({int(v) for v in pooled["flow/rows"]})
    summary["searches_per_run"] = sorted({run["searches"] for run in runs})
    summary["searches_expected"] = runs[0]["searches_expected"]  # a search every planner turn
    summary["peak_searches_in_flight"] = max(run["peak_searches_in_flight"] for run in runs)
    return {key: value for key, value in summary.items() if value is not None}


def limits(args: argparse.Namespace, sync: dict[str, Any], seconds: float) -> dict[str, Any]:
    """The ratios the synchronous arm's own R (rollout) and U (update) allow."""
    r, u, s = sync["rollout_seconds"], sync["update_seconds"], args.steps
    fixed = max(seconds - s * (r + u), 0.0)  # train()'s cost outside its steps
    return {
        "rollout_s": r,
        "update_s": u,
        "train_fixed_s": fixed,
        "ideal": (r + u) / max(r, u),
        "ideal_for_steps": s * (r + u) / (r + u + (s - 1) * max(r, u)),
        "ideal_with_fixed_cost": (fixed + s * (r + u)) / (fixed + r + u + (s - 1) * max(r, u)),
    }


def describe(summary: dict[str, Any]) -> str:
    parts = [f"{key}={value:.3g}" for key, value in summary.items() if isinstance(value, float)]
    rest = [f"{key}={value}" for key, value in summary.items() if not isinstance(value, float)]
    return " ".join(parts + rest)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--search-latency",
        type=float,
        default=DEFAULT_LATENCY,
        help=f"seconds each web search takes on the stand-in ({DEFAULT_LATENCY})",
    )
    parser.add_argument("--steps", type=int, default=12, help="training steps a repeat (12)")
    parser.add_argument("--repeats", type=int, default=MIN_REPEATS, help="timed pairs (3)")
    parser.add_argument("--questions", type=int, default=2, help="questions a step (2)")
    parser.add_argument("--generations", type=int, default=4, help="G, rollouts a question (4)")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="check the script: allow fewer than 3 repeats; results to a temporary file, "
        "no published figure",
    )
    parser.add_argument("--out", type=Path, help="JSON path (bench/results/async_training.json)")
    parser.add_argument("--work", type=Path, help="trainers' output folders (a temporary folder)")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps {args.steps}: at least 2 (the first rollout overlaps nothing)")
    if args.questions < 1 or args.generations < 2:
        parser.error("--questions must be >= 1 and --generations >= 2 (a group to compare)")
    if args.search_latency < 0:
        parser.error(f"--search-latency {args.search_latency}: seconds, >= 0")
    if args.repeats < 1 or not args.smoke:
        check_repeats(args.repeats)
    scratch = Path(tempfile.gettempdir()) / "flowlearn-async-training"
    args.work = args.work or scratch / "runs"
    smoke_out = scratch / "async_training_smoke.json"
    args.out = args.out or (smoke_out if args.smoke else RESULTS / "async_training.json")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)  # one core for the trainer, one for the producer (both arms)
    # over 10 searches at once outgrow requests' pool of 10; urllib3 opens the extra connections
    # and logs a warning as it discards each one afterwards: noise, not a fault
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    report = Report(args.out)
    report.data = provenance("async_training.py", argv) | {
        "smoke": args.smoke,
        "settings": {
            "search_latency_s": args.search_latency,
            "steps": args.steps,
            "repeats": args.repeats,
            "questions_per_step": args.questions,
            "generations": args.generations,
            "rows_per_step": args.questions * args.generations * TURNS,
            "planner_turns": TURNS,
            "completion_tokens": TOKENS,
            "planner": "tiny-qwen2-random, head biased to a web_search plan",
            "torch_threads": 1,
            "cpu_affinity": sorted(os.sched_getaffinity(0)),
        },
    }
    tok = tokenizer(args.work.parent / "tokenizer")
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    report.data["runs"] = runs  # every run in order, each arm's warm-up first

    with search_stand_in(args.search_latency) as server:

        def arm(name: str) -> Any:
            def once() -> float:
                runs[name].append(train_once(args, tok, server, name, len(runs[name])))
                return float(runs[name][-1]["steps_per_minute"])

            return once

        def on_repeat(index: int, values: dict[str, float]) -> None:
            shown = " ".join(f"{name}={value:.2f}" for name, value in values.items())
            report.say(f"repeat {index}: steps/minute {shown}")
            report.save()  # a kill keeps the repeats that finished

        speeds = alternate({name: arm(name) for name in ARMS}, args.repeats, on_repeat=on_repeat)
    timed = {name: found[1:] for name, found in runs.items()}  # the first is the warm-up
    pairs = ratios(speeds["async"], speeds["sync"])
    summaries = {name: arm_summary(found) for name, found in timed.items()}
    sync_seconds = statistics.median(run["seconds"] for run in timed["sync"])
    bounds = limits(args, summaries["sync"], sync_seconds)
    report.data |= {
        "arms": {
            name: {"steps_per_minute": spread(speeds[name]), "mean_over_steps": summaries[name]}
            for name in ARMS
        },
        "async_over_sync_steps_per_minute": pairs,
        "limits": bounds,
    }
    for name in ARMS:
        found = spread(speeds[name])
        report.say(
            f"{name} (max_staleness {ARMS[name]}): {found['median']:.2f} steps/minute "
            f"({found['min']:.2f}-{found['max']:.2f}); {describe(summaries[name])}"
        )
    report.say(
        f"sync step: rollout R={bounds['rollout_s']:.2f} s, update U={bounds['update_s']:.2f} s; "
        f"ideal (R+U)/max(R,U)={bounds['ideal']:.2f}, over {args.steps} steps "
        f"{bounds['ideal_for_steps']:.2f}, with train()'s fixed {bounds['train_fixed_s']:.1f} s "
        f"{bounds['ideal_with_fixed_cost']:.2f}"
    )
    if not args.smoke:
        compared = (
            f"max_staleness 1 vs 0, {args.questions} x {args.generations} rollouts a step, "
            f"{TURNS} turns each with a {args.search_latency:g} s web search, {args.steps} "
            "steps, tiny-qwen2-random, 1 torch thread"
        )
        report.data["headlines"] = [
            headline("async training, steps/minute over sync", pairs, "x", compared)
        ]
    report.say(figure_line("async_over_sync_steps_per_minute", pairs))
    report.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
