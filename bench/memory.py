"""Memory: peak RSS of one training step on CPU, Flow-GRPO beside TRL's stock GRPO update.

Run: `python bench/memory.py [--planner MODEL] [--repeats 3]`. Peak RSS is per process, so every
arm runs in a fresh subprocess of this script:
- `model`: the model and tokenizer loaded, nothing else (the floor);
- `stock`: TRL's `GRPOTrainer` update on fixed rows (as in `bench/update.py`);
- `flow`: a `FlowGRPOTrainer` update on the same rows, built from trajectories;
- `online`: one whole `flowlearn train` step with `examples/train.yaml` (rollouts through the
  real flow, then the update), the job users run.
Each arm's subprocess runs `--repeats` times (3), the arms' order reversed every other repeat.
There is no warm-up run: a peak RSS is a high-water mark of a fresh process, not a time, so
what ran before does not change it. Prints the median and min-max of each arm's peak RSS, of
what it adds over the floor, and of the per-repeat ratios flow/stock; writes every repeat's
values, the provenance (commit, command, machine, load) and the `headlines` to
bench/results/memory.json (`--out`). Peak GPU memory is reported by `bench/gpu_train.py`. At the
defaults (8 rows of 512+128 tokens) each update subprocess takes about a minute and 13 GiB on 2
CPU cores, so `--arms model,stock,flow` about 8 minutes; the `online` arm adds a whole training
step a repeat (not timed here).

`python bench/memory.py --micro 8,32 [--per-device 4] [--steps 3] [--repeats 3]` measures
micro-batching instead: `--steps` `FlowGRPOTrainer` updates (AdamW) of 8 and of 32 one-turn rows,
each with all rows in one pass (per_device_train_batch_size = rows) and with a fixed per-device
batch (steps_per_generation = gradient_accumulation_steps = rows / per-device). The updates' peak
is the process's peak RSS during `train()` (its high-water mark reset just before) less the RSS
before it; the time is the mean of the updates after the first (the process's warm-up), so
steady state. Each row count's two arms run in fresh subprocesses `--repeats` times, their order
reversed every other repeat, and each micro-batched run is set against the one-pass run of its
repeat (time and memory ratios: median and min-max). Writes the table to bench/results/memory.txt
and every run, the provenance and the `headlines` to bench/results/memory_micro.json (`--out`;
the table then beside it, as .txt). `--micro 8,32 --group 8 --prompt 64 --completion 32` takes
about 8 minutes on 2 CPU cores (estimated from the kept per-update times).
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

HERE = Path(__file__).parent
MICRO_RESULTS = RESULTS / "memory.txt"
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


def child(flags: list[str], what: str) -> dict[str, Any]:
    """Run this script with `flags` in a fresh process; return the JSON of its last line."""
    done = subprocess.run([sys.executable, __file__, *flags], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{what} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def passed(args: argparse.Namespace, names: tuple[str, ...]) -> list[str]:
    flags = [f"--{n.replace('_', '-')}={getattr(args, n)}" for n in names]
    return flags + ([f"--planner={args.planner}"] if args.planner else [])


def micro_rows(rows: int, args: argparse.Namespace) -> dict[str, Any]:
    """One row count: one pass and micro-batches, alternated `args.repeats` times; the ratios."""
    runs: dict[str, list[dict[str, Any]]] = {}
    arms = {}
    for per_device in sorted({rows, args.per_device}, reverse=True):
        name = "one_pass" if per_device == rows else "micro"
        runs[name] = []
        flags = passed(args, ("group", "prompt", "completion", "steps"))
        flags.append(f"--micro-arm={rows},{per_device}")

        def arm(name: str = name, flags: list[str] = flags, pd: int = per_device) -> float:
            runs[name].append(child(flags, f"rows {rows} per-device {pd}"))
            return float(runs[name][-1]["steady_seconds"])

        arms[name] = arm

    def report(repeat: int, seconds: dict[str, float]) -> None:
        print(
            f"  {rows} rows, repeat {repeat + 1}: "
            + ", ".join(f"{k} {v:.2f} s, {runs[k][-1]['update']:,} MiB" for k, v in seconds.items())
        )

    alternate(arms, args.repeats, warm_up=False, on_repeat=report)
    out: dict[str, Any] = {"rows": rows}
    for name, got in runs.items():
        out[name] = {
            "per_device": got[0]["per_device"],
            "steady_seconds": spread([r["steady_seconds"] for r in got]),
            "update_mib": spread([r["update"] for r in got]),
            "runs": got,
        }
    if "micro" in runs:
        seconds = {k: [r["steady_seconds"] for r in v] for k, v in runs.items()}
        mib = {k: [max(r["update"], 1) for r in v] for k, v in runs.items()}
        out["time_micro_over_one_pass"] = ratios(seconds["micro"], seconds["one_pass"])
        out["memory_micro_over_one_pass"] = ratios(mib["micro"], mib["one_pass"])
    return out


def micro_headlines(found: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per row count with a micro-batched arm: its time and memory ratios, and both arms' GiB."""
    rows_of = f"one-turn rows of {args.prompt}+{args.completion} tokens"
    out = []
    for got in found:
        if "micro" not in got:
            continue
        rows, micro = got["rows"], f"micro-batches of {got['micro']['per_device']}"
        compared = f"{rows} {rows_of}, updated in {micro} vs in one pass"
        gib = {
            name: spread([run["update"] / 1024 for run in got[name]["runs"]])
            for name in ("one_pass", "micro")
        }
        adds = "peak RSS an update adds"
        out += [
            headline(
                f"update time, {micro} over one pass, {rows} rows",
                got["time_micro_over_one_pass"],
                "x",
                f"steady-state seconds an update, {compared}",
            ),
            headline(
                f"update memory, {micro} over one pass, {rows} rows",
                got["memory_micro_over_one_pass"],
                "x",
                f"{adds}, {compared}",
            ),
            headline(
                f"update memory, one pass, {rows} rows",
                gib["one_pass"],
                "GiB",
                f"{adds}, {rows} {rows_of} in one pass",
            ),
            headline(
                f"update memory, {micro}, {rows} rows",
                gib["micro"],
                "GiB",
                f"{adds}, {rows} {rows_of} in {micro}",
            ),
        ]
    return out


def micro(args: argparse.Namespace, argv: list[str] | None) -> None:
    """Measure each row count with one pass and with a fixed per-device batch; write a table."""
    lines = [
        f"FlowGRPOTrainer updates on CPU, {args.planner or 'SmolLM2-135M'}, one-turn rows of "
        f"{args.prompt} prompt + {args.completion} completion tokens, AdamW, fp32.",
        "update MiB = peak RSS during train() - RSS before it (each run in a fresh process);",
        f"s/update = mean of updates 2..{args.steps} (the first warms up); x one pass = the "
        "micro-batched run's time and memory over the one-pass run's of the same repeat;",
        f"medians of {args.repeats} repeats, the two arms alternated, ranges in brackets",
        "",
        f"{'rows':>5} {'per-device':>10} {'micro-steps':>11} {'update MiB':>10} "
        f"{'s/update':>9} {'time x':>19} {'MiB x':>19}",
    ]
    found = []
    for rows in [int(r) for r in args.micro.split(",")]:
        got = micro_rows(rows, args)
        found.append(got)
        for name in ("one_pass", "micro"):
            if name not in got:
                continue
            arm, pd = got[name], got[name]["per_device"]
            time_x, mib_x = "1.00", "1.00"
            if name == "micro":
                t, m = got["time_micro_over_one_pass"], got["memory_micro_over_one_pass"]
                time_x = f"{t['median']:.2f} [{t['min']:.2f}-{t['max']:.2f}]"
                mib_x = f"{m['median']:.2f} [{m['min']:.2f}-{m['max']:.2f}]"
            lines.append(
                f"{rows:>5} {pd:>10} {rows // pd:>11} {round(arm['update_mib']['median']):>10,} "
                f"{arm['steady_seconds']['median']:>9.2f} {time_x:>19} {mib_x:>19}"
            )
    out = args.out or RESULTS / "memory_micro.json"
    table = MICRO_RESULTS if args.out is None else out.with_suffix(".txt")
    settings = {n: getattr(args, n) for n in ("group", "prompt", "completion", "steps")}
    result = provenance("memory.py", argv) | {
        "settings": settings | {"per_device": args.per_device, "repeats": args.repeats},
        "row_counts": found,
        "headlines": micro_headlines(found, args),
    }
    write_result(out, result)
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for got in found:
        for key in ("time_micro_over_one_pass", "memory_micro_over_one_pass"):
            if key in got:
                print(figure_line(f"{key}_{got['rows']}_rows", got[key]))
    print(f"wrote {out} and {table}")


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


def parse(argv: list[str] | None) -> argparse.Namespace:
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
        "--steps", type=int, default=3, help="micro table: updates per run, the first a warm-up"
    )
    parser.add_argument("--per-device", type=int, default=4, help="fixed per-device batch")
    parser.add_argument("--micro-arm", help=argparse.SUPPRESS)  # "rows,per_device", in a child
    parser.add_argument("--repeats", type=int, default=3, help="runs of each arm (3)")
    parser.add_argument(
        "--out", type=Path, help="JSON path (bench/results/memory.json; --micro: memory_micro.json)"
    )
    args = parser.parse_args(argv)
    if args.arm or args.micro_arm:
        return args
    check_repeats(args.repeats)
    unknown = sorted({a.strip() for a in args.arms.split(",")} - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; choose from {list(ARMS)}")
    for rows in [int(r) for r in args.micro.split(",")] if args.micro else []:
        if rows % args.per_device or rows % args.group:
            parser.error(f"--micro: {rows} rows is not a multiple of --per-device and --group")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.micro_arm:
        rows, per_device = (int(v) for v in args.micro_arm.split(","))
        print(json.dumps(micro_arm(rows, per_device, args)))
        return 0
    if args.micro:
        micro(args, argv)
        return 0
    if args.arm:
        print(json.dumps({"arm": args.arm, "peak_rss_mib": run_arm(args.arm, args)}))
        return 0
    arms = [a.strip() for a in args.arms.split(",")]
    flags = passed(args, ("questions", "group", "prompt", "completion"))

    def arm(name: str) -> float:
        return child([*flags, "--arm", name], f"arm {name}")["peak_rss_mib"]

    def report(repeat: int, peaks: dict[str, float]) -> None:
        print(f"  repeat {repeat + 1}: " + ", ".join(f"{k} {v:,.0f} MiB" for k, v in peaks.items()))

    print(f"peak RSS of {', '.join(arms)}, {args.repeats} repeats ...", flush=True)
    peaks = alternate({a: lambda a=a: arm(a) for a in arms}, args.repeats, False, report)
    result = provenance("memory.py", argv) | whole_step_figures(peaks, args)
    out = args.out or RESULTS / "memory.json"
    write_result(out, result)
    for name, values in peaks.items():
        print(figure_line(f"{name}_peak_rss_mib", spread(values)))
    if "flow_over_stock" in result:
        print(figure_line("flow_over_stock", result["flow_over_stock"]))
    print(f"wrote {out}")
    return 0


def whole_step_figures(peaks: dict[str, list[float]], args: argparse.Namespace) -> dict[str, Any]:
    """The default mode's result: each arm's peaks, over the floor, the ratios, the headlines."""
    rows = args.questions * args.group
    result: dict[str, Any] = {
        "rows": rows,
        "prompt_tokens": args.prompt,
        "completion_tokens": args.completion,
        "repeats": args.repeats,
        "peak_rss_mib": {name: spread(values) for name, values in peaks.items()},
    }
    floor = peaks.get("model")
    if floor is not None:
        result["over_model_mib"] = {
            name: spread([p - f for p, f in zip(values, floor, strict=True)])
            for name, values in peaks.items()
            if name != "model"
        }
    what = {
        "model": "the model and tokenizer loaded, nothing else",
        "stock": f"TRL's stock GRPO update of {rows} rows of "
        f"{args.prompt}+{args.completion} tokens",
        "flow": f"a Flow-GRPO update of the same {rows} rows",
        "online": "one whole `flowlearn train` step of examples/train.yaml",
    }
    headlines = []
    if "flow" in peaks and "stock" in peaks:
        result["flow_over_stock"] = ratios(peaks["flow"], peaks["stock"])
        headlines.append(
            headline(
                "peak RSS, Flow-GRPO update over TRL",
                result["flow_over_stock"],
                "x",
                f"{what['flow']} vs {what['stock']}, each in a fresh process",
            )
        )
        if floor is not None:
            result["flow_over_stock_above_model"] = ratios(
                [max(p - f, 1) for p, f in zip(peaks["flow"], floor, strict=True)],
                [max(p - f, 1) for p, f in zip(peaks["stock"], floor, strict=True)],
            )
    label = {
        "model": "the model alone",
        "stock": "TRL's stock update",
        "flow": "Flow-GRPO update",
        "online": "one flowlearn train step",
    }
    for name, values in peaks.items():
        gib = spread([v / 1024 for v in values])
        headlines.append(
            headline(f"peak RSS, {label[name]}", gib, "GiB", f"{what[name]}, in a fresh process")
        )
    result["headlines"] = headlines
    return result


if __name__ == "__main__":
    sys.exit(main())
