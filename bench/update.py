"""Update cost: a Flow-GRPO update on fixed per-turn rows vs TRL's stock GRPO update, same tokens.

Run: `python bench/update.py [--planner MODEL]`. Both arms get the same model weights and the
same padded rows (prompt and completion ids, masks, old logprobs); the stock arm receives them
as TRL's own `_generate_and_score_completions` would return them (one advantage per row), the
Flow-GRPO arm builds them from trajectories (rows, token weights, per-token advantages) and then
runs the same TRL loss. Prints seconds per update and the ratio (target: <= 1.10) and peak RSS;
writes bench/results/update.json.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import time
from pathlib import Path

import torch
from trl import GRPOConfig, GRPOTrainer

from flowlearn.engine.loading import load_model_and_tokenizer
from flowlearn.graphs import Context
from flowlearn.training import Trajectory, Transition
from flowlearn.training.trainer import FlowGRPOTrainer, unused_reward

RESULTS = Path(__file__).parent / "results" / "update.json"


def groups(q: int, g: int, prompt: int, completion: int, vocab: int) -> list[Trajectory]:
    rng = random.Random(0)
    out = []
    for i in range(q):
        ids = [rng.randrange(vocab) for _ in range(prompt)]
        for k in range(g):
            tid = f"{i}/{k}"
            done = [rng.randrange(vocab) for _ in range(completion)]
            turn = Transition(
                trajectory_id=tid,
                group_id=str(i),
                node="planner",
                turn=1,
                messages=[],
                output="",
                parse_status="ok",
                seconds=0.0,
                prompt_ids=ids,
                completion_ids=done,
                logprobs=[-2.0] * completion,
            )
            out.append(
                Trajectory(tid, str(i), "q", "r", "a", "a", float(k % 2), transitions=[turn])
            )
    return out


def config(out: Path, rows: int, g: int, completion: int) -> GRPOConfig:
    return GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=rows,
        num_generations=g,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_steps=1,
        learning_rate=1e-6,
        temperature=1.0,
        loss_type="dapo",
        beta=0.0,
        max_completion_length=completion,
        report_to="none",
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        bf16=torch.cuda.is_available(),
        disable_tqdm=True,
    )


def update(trainer, batch) -> None:  # type: ignore[no-untyped-def]
    """One loss, backward and optimizer step, as `Trainer.train` does for a step."""
    trainer.model.train()
    loss = trainer.compute_loss(
        trainer.model, batch, num_items_in_batch=batch["num_items_in_batch"]
    )
    trainer.accelerator.backward(loss)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad()
    assert torch.isfinite(loss)


def prepare(trainer, steps: int) -> None:  # type: ignore[no-untyped-def]
    """Set up what `train()` would before stepping by hand."""
    trainer.create_optimizer_and_scheduler(num_training_steps=steps)
    trainer.current_gradient_accumulation_steps = 1


def timed(trainer, inputs, repeats: int) -> float:  # type: ignore[no-untyped-def]
    prepare(trainer, repeats + 1)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        update(trainer, inputs())
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def stock_advantages(data: list[Trajectory], group: int) -> torch.Tensor:
    """One advantage per row, as TRL's stock GRPO computes them from the outcome rewards."""
    rewards = torch.tensor([t.reward for t in data]).view(-1, group)
    spread = rewards.std(1, keepdim=True) + 1e-4
    return ((rewards - rewards.mean(1, keepdim=True)) / spread).view(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", help="model (default: the embedded SmolLM2-135M)")
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model, tokenizer = load_model_and_tokenizer(args.planner)
    data = groups(args.questions, args.group, args.prompt, args.completion, len(tokenizer))
    rows = args.questions * args.group
    out = Path("/tmp/flowlearn-bench-update")
    flow = FlowGRPOTrainer.offline(
        model,
        args=config(out / "flow", rows, args.group, args.completion),
        trajectories=data,
        context=Context(planner_temperature=1.0),
        processing_class=tokenizer,
    )
    inputs = [{"case": row["case"]} for row in flow.train_dataset] * args.group
    flow_seconds = timed(flow, lambda: flow._generate_and_score_completions(inputs), args.repeats)
    fixed = flow._generate_and_score_completions(inputs)
    stock_inputs = dict(fixed, advantages=stock_advantages(data, args.group))
    stock = GRPOTrainer(
        model=model,
        reward_funcs=[unused_reward],
        args=config(out / "stock", rows, args.group, args.completion),
        train_dataset=flow.train_dataset,
        processing_class=tokenizer,
    )
    stock_seconds = timed(stock, lambda: dict(stock_inputs), args.repeats)
    result = {
        "model": getattr(model.config, "name_or_path", "default"),
        "rows": rows,
        "prompt_tokens": args.prompt,
        "completion_tokens": args.completion,
        "flow_grpo_seconds_per_update": round(flow_seconds, 3),
        "trl_grpo_seconds_per_update": round(stock_seconds, 3),
        "ratio": round(flow_seconds / stock_seconds, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
