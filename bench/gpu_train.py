"""GPU check: Flow-GRPO steps through the real flow vs TRL's stock GRPOTrainer, side by side.

Run: `python bench/gpu_train.py` on a machine with one CUDA GPU (`--tiny` runs a small model on
CPU, to check the script itself, and writes bench/results/gpu_train_cpu_small.txt). At its
defaults (4 steps, the first a warm-up and the other 3 timed; 128 tokens a call; 8 flows in
the rollout bench) it takes about 6 minutes on one H200 (4 at the 2 steps it took before). Each
trainer arm is one training run whose timed steps are its repeats; the ratio is the median of
the step-by-step ratios (step i of the flow over step i of TRL), with their range. The arms are
not alternated: each is a whole trainer, and running each twice would double a GPU budget of
minutes. The arms run in order of importance (Flow-GRPO step, TRL's
step, the rollout bench, the bf16 check) and the JSON is rewritten as each arm ends, so a
timeout keeps the figures of the arms that finished. Prompts: AgentFlow's
(`AGENTFLOW_PROMPTS`); the stock arm's are the flow arm's first-turn planner prompts (each
question's ids decoded with their special tokens, which TRL tokenizes again, as in
`rollout_speed.py`; `mean_prompt_tokens` over every step), or the
planner template with a one-line tool catalogue when the flow arm is skipped. A randomly
initialised model of the Qwen2.5-0.5B configuration, loaded in bf16, is the planner; the fixed
engine is scripted, so the measured time is the policy's. Both trainers get the same model
configuration, group size, batch and completion budget, and both train fp32 master weights
under bf16 autocast (the flow trainer upcasts them itself; the stock arm is handed them). The
JSON written to bench/results/gpu_train.json holds rollout and update seconds, completion
tokens per second and peak memory of each, and their ratios, for the per-device batch given
(`--micro-batch N`: N rows a pass, the step's rollouts in rows / N micro-steps of one update;
default: all of a step's rollouts in one micro-step). It also runs:
- the rollout benchmark of `bench/rollouts.py` on the same model: `--flows` flows (8), batched
  (`BatchingPolicy`, under planner and engine) vs one at a time, every call capped at
  `--rollout-tokens`;
- the bf16 check of `bench/gpu_checks.py`: the fraction of weights changed after
  `--weight-steps` updates at lr 1e-6 in bf16 vs fp32, and how close the two updates are.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import rollouts
import torch
from gpu_checks import QWEN25_05B, TINY, model, peak_gib, reset_peak, tokenizer, weights_move
from rollout_speed import Timer, first_planner_prompts, scripted_engine
from trl import GRPOConfig, GRPOTrainer

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS
from flowlearn.nodes.tools import python_tool
from flowlearn.training.trainer import FlowGRPOTrainer, read_metrics

PROMPTS = AGENTFLOW_PROMPTS
RESULTS = Path(__file__).parent / "results" / "gpu_train.json"
CPU_RESULTS = Path(__file__).parent / "results" / "gpu_train_cpu_small.txt"


def grpo_config(out: Path, args: argparse.Namespace, cuda: bool, **extra: Any) -> GRPOConfig:
    """The trainers' config; `extra` overrides any value (e.g. max_steps, bf16)."""
    rollouts = args.questions * args.group
    per_device = args.micro_batch or rollouts
    if rollouts % per_device:
        raise SystemExit(f"--micro-batch {per_device} does not divide the {rollouts} rollouts")
    values: dict[str, Any] = dict(
        output_dir=str(out),
        per_device_train_batch_size=per_device,
        num_generations=args.group,
        steps_per_generation=rollouts // per_device,  # one update per step, in micro-steps
        gradient_accumulation_steps=rollouts // per_device,
        max_steps=args.steps,
        learning_rate=1e-6,
        temperature=1.0,
        loss_type="dapo",
        beta=0.0,
        max_completion_length=args.tokens,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        bf16=cuda,
        use_cpu=not cuda,
        seed=0,
    )
    return GRPOConfig(**(values | extra))


def run_flow(args: argparse.Namespace, tok: Any, device: str, dtype: Any, out: Path) -> dict:
    cuda = device == "cuda"
    policy = model(args.shape, tok, device, dtype)
    rng = random.Random(0)
    cases = [
        Case(str(i), f"What is {rng.randint(2, 99)} + {rng.randint(2, 99)}?", "0")
        for i in range(args.questions * args.steps)
    ]
    trainer = FlowGRPOTrainer.online(
        policy,
        args=grpo_config(out / "flow", args, cuda),
        engine=scripted_engine(Timer()),  # instant: the timings are the policy's
        tools=[python_tool()],
        prompts=PROMPTS,
        rollout_concurrency=args.rollout_concurrency,
        scorer=lambda answer, case: Score(float(random.random() < 0.5), "random reward"),
        cases=cases,
        context=Context(  # with the analysis call, as the recorded figures were taken
            max_turns=args.turns,
            planner_temperature=1.0,
            planner_max_new_tokens=args.tokens,
            query_analysis=True,
        ),
        processing_class=tok,
    )
    rollouts_of = trainer.rollout

    def keeping_prompts(step_cases: list[Case]) -> list[Any]:
        """The step's rollouts; each question's first planner prompt kept for the stock arm."""
        trajectories = rollouts_of(step_cases)
        args.flow_prompts += first_planner_prompts(trajectories, tok)
        return trajectories

    args.flow_prompts = []
    trainer.rollout = keeping_prompts
    reset_peak(cuda)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    records = read_metrics(out / "flow" / "metrics.jsonl")
    records = records[1:] or records  # the first step warms up
    per_step = [
        r["flow/tokens"] / (r["flow/rollout_seconds"] + r["flow/update_seconds"]) for r in records
    ]
    rollout = statistics.mean(r["flow/rollout_seconds"] for r in records)
    update = statistics.mean(r["flow/update_seconds"] for r in records)
    tokens = statistics.mean(r["flow/tokens"] for r in records)
    return {
        "steps": args.steps,
        "rollout_concurrency": args.rollout_concurrency,
        "rollout_seconds_per_step_all": [r["flow/rollout_seconds"] for r in records],
        "update_seconds_per_step_all": [r["flow/update_seconds"] for r in records],
        "seconds_total": total,
        "rollout_seconds_per_step": rollout,
        "update_seconds_per_step": update,
        "completion_tokens_per_step": tokens,
        "completion_tokens_per_second": tokens / (rollout + update),
        "completion_tokens_per_second_per_step": per_step,
        "peak_memory_gib": peak_gib(cuda),
    }


def random_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Rewards for the stock trainer: only the update's cost is measured."""
    return [random.random() for _ in completions]


def run_stock(args: argparse.Namespace, tok: Any, device: str, dtype: Any, out: Path) -> dict:
    import datasets

    cuda = device == "cuda"
    policy = model(args.shape, tok, device, dtype).float()  # fp32 master weights, as the flow's
    prompts = getattr(args, "flow_prompts", [])
    if prompts:  # the flow's own first-turn prompts, as rollout_speed.py's TRL arm takes them
        rows = [{"prompt": p} for p in prompts]
    else:  # the flow arm was skipped: the planner template with a short catalogue
        rows = [{"prompt": [{"role": "user", "content": template_prompt(args)}]}]
    count = args.questions * args.steps
    data = datasets.Dataset.from_list((rows * count)[:count])
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[random_reward],
        args=grpo_config(out / "stock", args, cuda),
        train_dataset=data,
        processing_class=tok,
    )
    seen: list[int] = []
    generate = trainer._generate_single_turn

    def counting(prompt_ids: Any, *rest: Any, **kwargs: Any) -> Any:
        seen.extend(len(p) for p in prompt_ids)
        return generate(prompt_ids, *rest, **kwargs)

    trainer._generate_single_turn = counting
    reset_peak(cuda)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    logs = [h for h in trainer.state.log_history if "step_time" in h]
    logs = logs[1:] or logs  # the first step warms up
    times = [h["step_time"] for h in logs]
    lengths = [h.get("completions/mean_length", args.tokens) for h in logs]
    rows_a_step = args.questions * args.group
    step = statistics.mean(times)
    return {
        "steps": args.steps,
        "prompts": "the flow's first-turn planner prompts" if prompts else "the planner template",
        "mean_prompt_tokens": statistics.mean(seen) if seen else None,
        "seconds_total": total,
        "seconds_per_step": step,
        "completion_tokens_per_step": statistics.mean(lengths) * rows_a_step,
        "completion_tokens_per_second": statistics.mean(lengths) * rows_a_step / step,
        "completion_tokens_per_second_per_step": [
            length * rows_a_step / seconds for length, seconds in zip(lengths, times, strict=True)
        ],
        "peak_memory_gib": peak_gib(cuda),
    }


def template_prompt(args: argparse.Namespace) -> str:
    """The planner's first-turn prompt with a one-line tool catalogue and no worked plans."""
    return PROMPTS.template("planner", analysis=True).format(
        question="What is 12 + 30?",
        analysis="Analysis: arithmetic.",
        tools="- python: run code",
        memory="(no steps yet)",
        turn=1,
        max_turns=args.turns,
        tool_names="python",
        examples="",
    )


def run_rollouts(args: argparse.Namespace, tok: Any, device: str, dtype: Any) -> dict:
    """bench/rollouts.py's comparison on this model: N flows batched vs one at a time."""
    from flowlearn.engine.local import HFPolicy

    policy = HFPolicy(model(args.shape, tok, device, dtype), tok, version="random-qwen2.5-0.5b")
    settings = rollouts.parse(
        ["--flows", str(args.flows), "--tokens", str(args.rollout_tokens), "--repeats", "3"]
    )
    return rollouts.compare(policy, settings)


def save(result: dict[str, Any], target: Path, cuda: bool) -> None:
    """Write the figures so far (atomically): a timeout or kill keeps every finished arm."""
    text = json.dumps(result, indent=2, default=str) + "\n"
    if not cuda:  # the small CPU run checks the script; its figures are not the GPU's
        text = (
            f"CPU smoke run of `{result['command']}`: a script check, not the GPU result.\n{text}"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(target.suffix + ".partial")
    partial.write_text(text)
    partial.replace(target)


def step_ratios(flow: dict[str, Any], stock: dict[str, Any]) -> dict[str, Any]:
    """The flow's tokens per second over TRL's, step i against step i: their median and all of
    them (nothing when an arm failed or was skipped)."""
    key = "completion_tokens_per_second_per_step"
    if key not in flow or key not in stock:
        return {}
    pairs = [a / b for a, b in zip(flow[key], stock[key], strict=False)]
    return {
        "tokens_per_second_ratio_flow_over_stock": statistics.median(pairs),
        "tokens_per_second_ratio_pairs": pairs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small model on CPU (script check)")
    parser.add_argument(
        "--steps", type=int, default=4, help="steps; the first warms up, the rest are timed (4)"
    )
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128, help="completion budget a call (128)")
    parser.add_argument(
        "--rollout-concurrency",
        type=int,
        help="flow: rollouts in flight, the planner's batch capacity (default: the trainer's, "
        "the step's rollouts, questions x G)",
    )
    parser.add_argument("--flows", type=int, default=8, help="rollout bench: flows (8)")
    parser.add_argument(
        "--rollout-tokens", type=int, default=64, help="rollout bench: tokens per call (64)"
    )
    parser.add_argument(
        "--micro-batch", type=int, help="rows per forward/backward pass (default: all rollouts)"
    )
    parser.add_argument(
        "--weight-steps", type=int, default=10, help="bf16 check: updates at lr 1e-6 (10)"
    )
    parser.add_argument("--skip", nargs="*", default=[], choices=ARMS, help="arms to leave out")
    parser.add_argument("--out", type=Path, default=Path("/tmp/flowlearn-gpu-train"))
    parser.add_argument("--results", type=Path, help="JSON path (bench/results/gpu_train.json)")
    args = parser.parse_args()
    if args.steps < 4 and not args.tiny:
        parser.error("--steps must be >= 4: a warm-up step, then at least 3 timed")
    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --tiny to check on CPU")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # `timeout`: keep what finished
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    args.shape = TINY if args.tiny else QWEN25_05B
    target = args.results or (RESULTS if cuda else CPU_RESULTS)
    tok = tokenizer(args.out / "tokenizer")
    settings = ("steps", "questions", "group", "turns", "tokens", "rollout_concurrency")
    settings += ("micro_batch", "flows", "rollout_tokens", "weight_steps")
    result: dict[str, Any] = {
        "command": " ".join(["python", "bench/gpu_train.py", *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": torch.cuda.get_device_name() if cuda else "cpu (--tiny script check)",
        "model": "Qwen2.5-0.5B configuration, random init, bf16" if cuda else "tiny Qwen2, fp32",
        "prompt_set": PROMPTS.name,
        "settings": {k: vars(args)[k] for k in settings},
        "peak_memory": "torch's peak GPU allocation" if cuda else "the process's peak RSS",
        "per_device_train_batch_size": args.micro_batch or args.questions * args.group,
    }
    print(f"gpu_train: {result}", flush=True)
    arms = {
        "flow_grpo": lambda: run_flow(args, tok, device, dtype, args.out),
        "trl_grpo": lambda: run_stock(args, tok, device, dtype, args.out),
        "rollouts_batched_vs_sequential": lambda: run_rollouts(args, tok, device, dtype),
        "bf16_weights_move": lambda: weights_move(
            lambda kind: model(args.shape, tok, device, kind),
            tok,
            lambda out, **extra: grpo_config(out, args, cuda, **extra),
            args,
            cuda,
        ),
    }
    began = time.perf_counter()
    try:
        for name, arm in arms.items():
            if name in args.skip:
                continue
            print(f"[{time.perf_counter() - began:6.0f} s] {name} ...", flush=True)
            arm_began = time.perf_counter()
            try:
                result[name] = arm()
            except Exception as exc:  # one arm failing must not cost the others' figures
                result[name] = {"error": f"{type(exc).__name__}: {exc}"}
            result[name]["arm_seconds"] = time.perf_counter() - arm_began
            if name == "trl_grpo":
                result |= step_ratios(result.get("flow_grpo", {}), result["trl_grpo"])
            save(result, target, cuda)
            print(json.dumps({name: result[name]}, indent=2, default=str), flush=True)
            print(f"[{time.perf_counter() - began:6.0f} s] {name} done; wrote {target}", flush=True)
    finally:
        result["seconds_total"] = time.perf_counter() - began
        save(result, target, cuda)
    ratio = result.get("tokens_per_second_ratio_flow_over_stock")
    pairs = result.get("tokens_per_second_ratio_pairs") or [float("nan")]
    print(
        f"wrote {target}; flow_over_stock_tokens_per_second={ratio} pairs={len(pairs)} "
        f"range={min(pairs):.3g}-{max(pairs):.3g}"
    )


ARMS = ("flow_grpo", "trl_grpo", "rollouts_batched_vs_sequential", "bf16_weights_move")

if __name__ == "__main__":
    main()
