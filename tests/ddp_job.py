"""One offline Flow-GRPO update per scenario, run by 1 process or under `accelerate launch`.

`python ddp_job.py MODEL_DIR OUT_DIR` trains each scenario of SCENARIOS once (SGD, lr 1, no
clipping) and saves, from process 0, the update's gradient and the weights' change to
OUT_DIR/<scenario>.<processes>.pt, and from every process the questions it trained. With 2
processes each trains half of a step's questions; with 1, the same config doubled takes them
all: the two must make the same update.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from flow_rows import SPEC, KeepGradients, Spec, perturb, toy_config, toy_trajectories
from transformers import AutoModelForCausalLM, AutoTokenizer

from flowlearn.graphs import Context
from flowlearn.training.trainer import FlowGRPOTrainer

ONE_EMPTY: Spec = {  # with drop_zero_variance, the process that gets q-flat has no rows
    "q-flat": [(1.0, [4, 2]), (1.0, [3])],
    "q-live": [(0.0, [5]), (1.0, [2, 6, 3])],
}
SCENARIOS: dict[str, tuple[Spec, dict[str, Any], dict[str, Any]]] = {
    # spec, per-process config at 2 processes (halved rollouts), trainer options
    "micro": (
        SPEC,
        dict(
            per_device_train_batch_size=2,
            steps_per_generation=2,
            gradient_accumulation_steps=2,
            beta=0.04,
        ),
        {},
    ),
    "one_empty": (ONE_EMPTY, dict(per_device_train_batch_size=2), {"drop_zero_variance": True}),
}


def run(model_dir: Path, out: Path, name: str, processes: int) -> None:
    spec, options, trainer_options = SCENARIOS[name]
    options = dict(options)
    if processes == 1:  # the union of both processes' rollouts in one batch
        options["per_device_train_batch_size"] *= 2 * options.get("steps_per_generation", 1)
        options.update(steps_per_generation=1, gradient_accumulation_steps=1)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    keep = KeepGradients()
    trainer = FlowGRPOTrainer.offline(
        model,
        args=toy_config(out / f"{name}-{processes}", **options),
        trajectories=toy_trajectories(model, spec),
        context=Context(max_turns=3, planner_temperature=0.7, planner_max_new_tokens=16),
        processing_class=tokenizer,
        callbacks=[keep],
        **trainer_options,
    )
    perturb(model, seed=1, scale=0.003)  # off its frozen KL reference
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    trainer.train()
    rank = trainer.accelerator.process_index
    (out / f"{name}.groups.{processes}.{rank}.json").write_text(
        json.dumps(sorted(trainer.group_rewards))
    )
    if rank == 0:
        after = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
        delta = {k: after[k].detach() - before[k] for k in before}
        torch.save({"grads": keep.steps, "delta": delta}, out / f"{name}.{processes}.pt")


def main(model_dir: str, out: str) -> None:
    processes = int(os.environ.get("WORLD_SIZE", "1"))  # set by accelerate's torchrun launcher
    for name in SCENARIOS:
        run(Path(model_dir), Path(out), name, processes)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
