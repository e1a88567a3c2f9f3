"""GPU check: Flow-GRPO steps through the real flow vs TRL's stock GRPOTrainer, side by side.

Run: `python bench/gpu_train.py` on a machine with one CUDA GPU (`--tiny` runs a small model on
CPU, to check the script itself, and writes bench/results/gpu_train_cpu_small.txt). A randomly
initialised model of the Qwen2.5-0.5B configuration, loaded in bf16, is the planner; the fixed
engine is scripted, so the measured time is the policy's. Both trainers get the same model
configuration, group size, batch and completion budget, and both train fp32 master weights
under bf16 autocast (the flow trainer upcasts them itself; the stock arm is handed them). The
JSON written to bench/results/gpu_train.json holds rollout and update seconds, completion
tokens per second and peak memory of each, and their ratios, for the per-device batch given
(`--micro-batch N`: N rows a pass, the step's rollouts in rows / N micro-steps of one update;
default: all of a step's rollouts in one micro-step). It also runs:
- the rollout benchmark of `bench/rollouts.py` on the same model: 16 flows, batched
  (`BatchingPolicy`, under planner and engine) vs one at a time;
- the bf16 check of `bench/gpu_checks.py`: the fraction of weights changed after
  `--weight-steps` updates at lr 1e-6 in bf16 vs fp32, and how close the two updates are.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import rollouts
import torch
from gpu_checks import QWEN25_05B, TINY, model, peak_gib, reset_peak, tokenizer, weights_move
from trl import GRPOConfig, GRPOTrainer

from flowlearn.engine.scripted import ScriptedChatModel as FakeChatModel
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context
from flowlearn.nodes.prompts import PLANNER_PROMPT
from flowlearn.nodes.tools import python_tool
from flowlearn.training.trainer import FlowGRPOTrainer, read_metrics

RESULTS = Path(__file__).parent / "results" / "gpu_train.json"
CPU_RESULTS = Path(__file__).parent / "results" / "gpu_train_cpu_small.txt"


def engine() -> FakeChatModel:
    """Scripted fixed engine: instant, so the timings are the policy's."""

    def respond(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        from langchain_core.messages import AIMessage

        if tools:
            call = {"name": tools[0]["name"], "args": {"code": "print(1)"}, "id": "1"}
            return AIMessage("", tool_calls=[call])
        prompt = str(messages[-1].content)
        if prompt.startswith("Judge whether"):
            return "Conclusion: CONTINUE"
        return "<answer>1</answer>" if prompt.startswith("Answer") else "Analysis: arithmetic."

    return FakeChatModel(respond=respond)


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
        engine=engine(),
        tools=[python_tool()],
        scorer=lambda answer, case: Score(float(random.random() < 0.5), "random reward"),
        cases=cases,
        context=Context(  # with the analysis call, as the recorded figures (before session 24)
            max_turns=args.turns,
            planner_temperature=1.0,
            planner_max_new_tokens=args.tokens,
            query_analysis=True,
        ),
        processing_class=tok,
    )
    reset_peak(cuda)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    records = read_metrics(out / "flow" / "metrics.jsonl")[1:]  # the first step warms up
    rollout = statistics.mean(r["flow/rollout_seconds"] for r in records)
    update = statistics.mean(r["flow/update_seconds"] for r in records)
    tokens = statistics.mean(r["flow/tokens"] for r in records)
    return {
        "steps": args.steps,
        "seconds_total": total,
        "rollout_seconds_per_step": rollout,
        "update_seconds_per_step": update,
        "completion_tokens_per_step": tokens,
        "completion_tokens_per_second": tokens / (rollout + update),
        "peak_memory_gib": peak_gib(cuda),
    }


def random_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Rewards for the stock trainer: only the update's cost is measured."""
    return [random.random() for _ in completions]


def run_stock(args: argparse.Namespace, tok: Any, device: str, dtype: Any, out: Path) -> dict:
    import datasets

    cuda = device == "cuda"
    policy = model(args.shape, tok, device, dtype).float()  # fp32 master weights, as the flow's
    prompt = PLANNER_PROMPT.format(
        question="What is 12 + 30?",
        analysis="Analysis: arithmetic.",
        tools="- python: run code",
        memory="(no steps yet)",
        turn=1,
        max_turns=args.turns,
        tool_names="python",
        examples="",
    )
    data = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": prompt}]}] * (args.questions * args.steps)
    )
    trainer = GRPOTrainer(
        model=policy,
        reward_funcs=[random_reward],
        args=grpo_config(out / "stock", args, cuda),
        train_dataset=data,
        processing_class=tok,
    )
    reset_peak(cuda)
    start = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - start
    logs = [h for h in trainer.state.log_history if "step_time" in h][1:]
    times = [h["step_time"] for h in logs]
    lengths = [h.get("completions/mean_length", args.tokens) for h in logs]
    rows = args.questions * args.group
    step = statistics.mean(times)
    return {
        "steps": args.steps,
        "seconds_total": total,
        "seconds_per_step": step,
        "completion_tokens_per_step": statistics.mean(lengths) * rows,
        "completion_tokens_per_second": statistics.mean(lengths) * rows / step,
        "peak_memory_gib": peak_gib(cuda),
    }


def run_rollouts(args: argparse.Namespace, tok: Any, device: str, dtype: Any) -> dict:
    """bench/rollouts.py's comparison on this model: N flows batched vs one at a time."""
    from flowlearn.engine.local import HFPolicy

    policy = HFPolicy(model(args.shape, tok, device, dtype), tok, version="random-qwen2.5-0.5b")
    return rollouts.compare(policy, args.flows, args.rollout_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="small model on CPU (script check)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--flows", type=int, default=16, help="rollout bench: flows (16)")
    parser.add_argument(
        "--rollout-tokens", type=int, default=64, help="rollout bench: tokens per call (64)"
    )
    parser.add_argument(
        "--micro-batch", type=int, help="rows per forward/backward pass (default: all rollouts)"
    )
    parser.add_argument(
        "--weight-steps", type=int, default=10, help="bf16 check: updates at lr 1e-6 (10)"
    )
    parser.add_argument("--out", type=Path, default=Path("/tmp/flowlearn-gpu-train"))
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.tiny
    if not cuda and not args.tiny:
        raise SystemExit("no CUDA device: run on a GPU machine, or pass --tiny to check on CPU")
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    args.shape = TINY if args.tiny else QWEN25_05B
    tok = tokenizer(args.out / "tokenizer")
    flow = run_flow(args, tok, device, dtype, args.out)
    stock = run_stock(args, tok, device, dtype, args.out)
    batching = run_rollouts(args, tok, device, dtype)
    weights = weights_move(
        lambda kind: model(args.shape, tok, device, kind),
        tok,
        lambda out, **extra: grpo_config(out, args, cuda, **extra),
        args,
        cuda,
    )
    settings = ("steps", "questions", "group", "turns", "tokens", "micro_batch", "weight_steps")
    result = {
        "device": torch.cuda.get_device_name() if cuda else "cpu (--tiny script check)",
        "model": "Qwen2.5-0.5B configuration, random init, bf16" if cuda else "tiny Qwen2, fp32",
        "settings": {k: vars(args)[k] for k in settings},
        "peak_memory": "torch's peak GPU allocation" if cuda else "the process's peak RSS",
        "per_device_train_batch_size": args.micro_batch or args.questions * args.group,
        "bf16_weights_move": weights,
        "flow_grpo": flow,
        "trl_grpo": stock,
        "tokens_per_second_ratio_flow_over_stock": flow["completion_tokens_per_second"]
        / stock["completion_tokens_per_second"],
        "rollouts_batched_vs_sequential": batching,
    }
    text = json.dumps(result, indent=2) + "\n"
    print(text, end="")
    target = RESULTS if cuda else CPU_RESULTS
    if not cuda:  # the small CPU run checks the script; its figures are not the GPU's
        command = " ".join(["python", "bench/gpu_train.py", *sys.argv[1:]])
        text = f"CPU smoke run of `{command}`: a script check, not the GPU result.\n{text}"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
