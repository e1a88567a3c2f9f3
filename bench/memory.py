"""Memory: peak RSS of one training step on CPU, Flow-GRPO beside TRL's stock GRPO update.

Run: `python bench/memory.py [--planner MODEL]`. Peak RSS is per process, so every arm runs
in a fresh subprocess of this script, one after the other:
- `model`: the model and tokenizer loaded, nothing else (the floor);
- `stock`: TRL's `GRPOTrainer` update on fixed rows (as in `bench/update.py`);
- `flow`: a `FlowGRPOTrainer` update on the same rows, built from trajectories;
- `online`: one whole `flowlearn train` step with `examples/train.yaml` (rollouts through the
  real flow, then the update), the job users run.
Prints each arm's peak RSS, what it adds over the floor and the flow/stock ratio; writes
bench/results/memory.json. Peak GPU memory is reported by `bench/gpu_train.py`.

`python bench/memory.py --micro 8,32 [--per-device 4] [--steps 3]` measures micro-batching
instead: `--steps` `FlowGRPOTrainer` updates (AdamW) of 8 and of 32 one-turn rows, each with all
rows in one pass (per_device_train_batch_size = rows) and with a fixed per-device batch
(steps_per_generation = gradient_accumulation_steps = rows / per-device). The updates' peak is
the process's peak RSS during `train()` (its high-water mark reset just before) less the RSS
before it; the time is the mean of the updates after the first (a warm-up), so steady state.
Each micro-batched arm is set against the one-pass arm of its rows (time and memory ratios);
writes bench/results/memory.txt and memory_micro.json.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE / "results" / "memory.json"
MICRO_RESULTS = HERE / "results" / "memory.txt"
ARMS = ("model", "stock", "flow", "online")


def peak_rss_mib() -> int:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def rss_mib(field: str) -> int:
    """Return VmRSS or VmHWM (the peak since the last reset) of this process, in MiB."""
    status = Path("/proc/self/status").read_text()
    return round(int(re.search(rf"{field}:\s+(\d+)", status).group(1)) / 1024)  # type: ignore[union-attr]


def micro_arm(rows: int, per_device: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run `args.steps` updates of `rows` one-turn rows, `per_device` rows a pass.

    Returns the peak memory over all updates and each update's seconds; the first is a
    warm-up, so the steady-state time is the mean of the later ones.
    """
    sys.path.insert(0, str(HERE))
    import time

    from transformers import TrainerCallback
    from trl import GRPOConfig
    from update import groups

    from flowlearn.engine.loading import load_model_and_tokenizer
    from flowlearn.graphs import Context
    from flowlearn.training.trainer import FlowGRPOTrainer

    model, tokenizer = load_model_and_tokenizer(args.planner)
    data = groups(rows // args.group, args.group, args.prompt, args.completion, len(tokenizer))
    steps = rows // per_device
    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="flowlearn-mem-"),
        per_device_train_batch_size=per_device,
        steps_per_generation=steps,
        gradient_accumulation_steps=steps,
        num_generations=args.group,
        max_steps=args.steps,
        learning_rate=1e-6,
        temperature=1.0,
        loss_type="dapo",
        beta=0.0,
        max_completion_length=args.completion,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config,
        trajectories=data,
        context=Context(planner_temperature=1.0),
        processing_class=tokenizer,
    )
    seconds: list[float] = []

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, *_: Any, **__: Any) -> None:
            seconds.append(time.perf_counter() - self.start)

    trainer.add_callback(StepTimer())
    floor = rss_mib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the RSS now
    trainer.train()
    peak = rss_mib("VmHWM")
    steady = seconds[1:] or seconds
    return {
        "rows": rows,
        "per_device": per_device,
        "floor": floor,
        "update": peak - floor,
        "seconds": seconds,
        "steady_seconds": sum(steady) / len(steady),
    }


def micro(args: argparse.Namespace) -> None:
    """Measure each row count with one pass and with a fixed per-device batch; write a table."""
    lines = [
        f"FlowGRPOTrainer updates on CPU, {args.planner or 'SmolLM2-135M'}, one-turn rows of "
        f"{args.prompt} prompt + {args.completion} completion tokens, AdamW, fp32.",
        "update MiB = peak RSS during train() - RSS before it (each arm in a fresh process);",
        f"s/update = mean of updates 2..{args.steps} (the first warms up); x one pass = the "
        "micro-batched arm's time and memory over the one-pass arm's",
        "",
        f"{'rows':>5} {'per-device':>10} {'micro-steps':>11} {'update MiB':>10} "
        f"{'s/update':>9} {'time x':>7} {'MiB x':>6}",
    ]
    results = []
    for rows in [int(r) for r in args.micro.split(",")]:
        for per_device in sorted({rows, args.per_device}, reverse=True):
            names = ("group", "prompt", "completion", "steps")
            passed = [f"--{n}={getattr(args, n)}" for n in names]
            passed += [f"--planner={args.planner}"] if args.planner else []
            child = subprocess.run(
                [sys.executable, __file__, *passed, f"--micro-arm={rows},{per_device}"],
                capture_output=True,
                text=True,
            )
            if child.returncode != 0:
                sys.exit(
                    f"rows {rows} per-device {per_device} failed ({child.returncode}):\n"
                    f"{child.stderr[-3000:]}"
                )
            got = json.loads(child.stdout.strip().splitlines()[-1])
            results.append(got)
            one_pass = next(r for r in results if r["rows"] == rows)  # run first: per_device rows
            lines.append(
                f"{rows:>5} {per_device:>10} {rows // per_device:>11} {got['update']:>10,} "
                f"{got['steady_seconds']:>9.2f} "
                f"{got['steady_seconds'] / one_pass['steady_seconds']:>7.2f} "
                f"{got['update'] / max(one_pass['update'], 1):>6.2f}"
            )
            print(lines[-1], flush=True)
    MICRO_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    MICRO_RESULTS.write_text("\n".join(lines) + "\n")
    MICRO_RESULTS.with_name("memory_micro.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(lines))


def run_arm(arm: str, args: argparse.Namespace) -> int:
    """Run one arm in this process and return its peak RSS in MiB."""
    if arm == "online":
        from flowlearn.compose import build_training_parts
        from flowlearn.training.config import parse_config
        from flowlearn.training.run import train

        examples = HERE.parent / "examples"
        flags = ["--config", str(examples / "train.yaml"), "--max_turns", "1"]
        flags += ["--data", str(examples / "train_questions.jsonl")]
        flags += ["--output_dir", tempfile.mkdtemp(prefix="flowlearn-mem-")]
        if args.planner:
            flags += ["--planner", args.planner]
        config = parse_config(flags)
        train(config, build_training_parts(config))
        return peak_rss_mib()

    from trl import GRPOTrainer

    sys.path.insert(0, str(HERE))
    from update import config, groups, prepare, stock_advantages, update

    from flowlearn.engine.loading import load_model_and_tokenizer
    from flowlearn.graphs import Context
    from flowlearn.training.trainer import FlowGRPOTrainer, unused_reward

    model, tokenizer = load_model_and_tokenizer(args.planner)
    if arm == "model":
        return peak_rss_mib()
    data = groups(args.questions, args.group, args.prompt, args.completion, len(tokenizer))
    rows = args.questions * args.group
    out = Path(tempfile.mkdtemp(prefix="flowlearn-mem-"))
    flow = FlowGRPOTrainer.offline(
        model,
        args=config(out / "flow", rows, args.group, args.completion),
        trajectories=data,
        context=Context(planner_temperature=1.0),
        processing_class=tokenizer,
    )
    inputs = [{"case": row["case"]} for row in flow.train_dataset] * args.group
    batch = flow._generate_and_score_completions(inputs)
    if arm == "flow":
        prepare(flow, 1)
        update(flow, batch)
        return peak_rss_mib()
    batch["advantages"] = stock_advantages(data, args.group)
    stock = GRPOTrainer(
        model=model,
        reward_funcs=[unused_reward],
        args=config(out / "stock", rows, args.group, args.completion),
        train_dataset=flow.train_dataset,
        processing_class=tokenizer,
    )
    del flow
    prepare(stock, 1)
    update(stock, batch)
    return peak_rss_mib()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", help="model (default: the embedded SmolLM2-135M)")
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--arms", default=",".join(ARMS), help="which arms, comma-separated")
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one arm, in a child
    parser.add_argument("--micro", help="row counts for the micro-batching table, e.g. 8,32")
    parser.add_argument(
        "--steps", type=int, default=3, help="micro table: updates per arm, the first a warm-up"
    )
    parser.add_argument("--per-device", type=int, default=4, help="fixed per-device batch")
    parser.add_argument("--micro-arm", help=argparse.SUPPRESS)  # "rows,per_device", in a child
    args = parser.parse_args()
    if args.micro_arm:
        rows, per_device = (int(v) for v in args.micro_arm.split(","))
        print(json.dumps(micro_arm(rows, per_device, args)))
        return
    if args.micro:
        micro(args)
        return
    if args.arm:
        print(json.dumps({"arm": args.arm, "peak_rss_mib": run_arm(args.arm, args)}))
        return
    arms = [a.strip() for a in args.arms.split(",")]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {list(ARMS)}")
    peaks: dict[str, int] = {}
    passed = [
        f"--{name}={getattr(args, name)}" for name in ("questions", "group", "prompt", "completion")
    ] + ([f"--planner={args.planner}"] if args.planner else [])
    for arm in arms:
        child = subprocess.run(
            [sys.executable, __file__, *passed, "--arm", arm], capture_output=True, text=True
        )
        if child.returncode != 0:
            sys.exit(f"arm {arm} failed:\n{child.stderr[-3000:]}")
        peaks[arm] = json.loads(child.stdout.strip().splitlines()[-1])["peak_rss_mib"]
        print(f"{arm:>7}: peak RSS {peaks[arm]:,} MiB", flush=True)
    result: dict[str, object] = {
        "rows": args.questions * args.group,
        "prompt_tokens": args.prompt,
        "completion_tokens": args.completion,
        "peak_rss_mib": peaks,
    }
    floor = peaks.get("model")
    if floor is not None:
        result["over_model_mib"] = {a: p - floor for a, p in peaks.items() if a != "model"}
    if "flow" in peaks and "stock" in peaks:
        result["flow_over_stock"] = round(peaks["flow"] / peaks["stock"], 3)
        if floor is not None:
            extra = (peaks["flow"] - floor) / max(peaks["stock"] - floor, 1)
            result["flow_over_stock_above_model"] = round(extra, 3)
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
