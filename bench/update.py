"""Update cost: a Flow-GRPO update on fixed per-turn rows vs TRL's stock GRPO update, same tokens.

Run: `python bench/update.py [--planner MODEL] [--repeats 3]`. Both arms get the same model
weights and the same padded rows (prompt and completion ids, masks, old logprobs); the stock arm
receives them as TRL's own `_generate_and_score_completions` would return them (one advantage
per row), the Flow-GRPO arm builds them from trajectories (rows, token weights, per-token
advantages) and then runs the same TRL loss; both arms update the one model, each with its own
optimizer. An arm's time is one loss, backward and optimizer step, with the building of its
batch (the Flow-GRPO arm's from the trajectories, the stock arm's a copy of the fixed rows).
After an untimed warm-up update of each arm, the arms update `--repeats` times (3), their order
reversed every other repeat. Prints each arm's median seconds, the median and min-max of the
pair ratios flow/TRL (one a repeat; target: <= 1.10) and the process's peak RSS; writes every
repeat's seconds, the provenance (commit, command, machine, load) and the `headlines` to
bench/results/update.json (`--out`). At the defaults (8 rows of 512+128 tokens) about 8 updates
of about 50 s each on 2 CPU cores, so about 7-8 minutes, with about 16 GiB of peak RSS
(estimated from the kept result, not rerun at the defaults).
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
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
from trl import GRPOConfig, GRPOTrainer

from flowlearn.engine.loading import load_model_and_tokenizer
from flowlearn.graphs import Context
from flowlearn.training import Trajectory, Transition
from flowlearn.training.trainer import FlowGRPOTrainer, unused_reward


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


def stock_advantages(data: list[Trajectory], group: int) -> torch.Tensor:
    """One advantage per row, as TRL's stock GRPO computes them from the outcome rewards."""
    rewards = torch.tensor([t.reward for t in data]).view(-1, group)
    spread = rewards.std(1, keepdim=True) + 1e-4
    return ((rewards - rewards.mean(1, keepdim=True)) / spread).view(-1)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--planner", help="model (default: the embedded SmolLM2-135M)")
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--completion", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="timed updates of each arm (3)")
    parser.add_argument("--out", type=Path, default=RESULTS / "update.json", help="JSON path")
    args = parser.parse_args(argv)
    check_repeats(args.repeats)
    return args


def trainers(args: argparse.Namespace) -> tuple[dict[str, Callable[[], float]], str]:
    """Both arms on one model, each a callable timing one update (its batch built inside), and
    the model's name."""
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
    fixed = flow._generate_and_score_completions(inputs)
    stock_inputs = dict(fixed, advantages=stock_advantages(data, args.group))
    stock = GRPOTrainer(
        model=model,
        reward_funcs=[unused_reward],
        args=config(out / "stock", rows, args.group, args.completion),
        train_dataset=flow.train_dataset,
        processing_class=tokenizer,
    )
    for trainer in (flow, stock):
        prepare(trainer, args.repeats + 1)

    def timed(trainer: Any, batch: Callable[[], dict[str, Any]]) -> Callable[[], float]:
        def once() -> float:
            start = time.perf_counter()
            update(trainer, batch())
            return time.perf_counter() - start

        return once

    arms = {
        "flow_grpo": timed(flow, lambda: flow._generate_and_score_completions(inputs)),
        "trl_grpo": timed(stock, lambda: dict(stock_inputs)),
    }
    return arms, getattr(model.config, "name_or_path", "default")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    arms, model = trainers(args)

    def report(repeat: int, seconds: dict[str, float]) -> None:
        print(f"  repeat {repeat + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items()))

    rows = args.questions * args.group
    print(f"{rows} rows, {args.repeats} repeats of {', '.join(arms)} ...", flush=True)
    seconds = alternate(arms, args.repeats, on_repeat=report)
    ratio = ratios(seconds["flow_grpo"], seconds["trl_grpo"])
    result: dict[str, Any] = provenance("update.py", argv) | {
        "model": model,
        "rows": rows,
        "prompt_tokens": args.prompt,
        "completion_tokens": args.completion,
        "repeats": args.repeats,
        "flow_grpo_seconds_per_update": spread(seconds["flow_grpo"]),
        "trl_grpo_seconds_per_update": spread(seconds["trl_grpo"]),
        "ratio": ratio,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    result["headlines"] = [
        headline(
            "update time, Flow-GRPO over TRL",
            ratio,
            "x",
            f"one Flow-GRPO update vs TRL's stock GRPO update, same {rows} rows of "
            f"{args.prompt}+{args.completion} tokens; the Flow-GRPO arm's time includes building "
            "its rows from trajectories, the stock arm's tensors are given",
        )
    ]
    write_result(args.out, result)
    for name in arms:
        print(f"{name}: {result[name + '_seconds_per_update']['median']:.2f} s an update (median)")
    print(f"peak RSS {result['peak_rss_mib']:,} MiB")
    print(figure_line("flow_over_trl_seconds", ratio) + f"; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
