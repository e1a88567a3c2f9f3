"""An offline Flow-GRPO setup on the tiny model: a config, and rollouts sampled from a policy."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from trl import GRPOConfig

from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Sampling
from flowlearn.graphs import Context
from flowlearn.training.trajectories import Trajectory, Transition

CONTEXT = Context(max_turns=2, planner_temperature=0.7, planner_max_new_tokens=12)
CASES = [
    {"prompt": str(g), "case": f'{{"id": "{g}", "query": "q", "reference": null}}'}
    for g in range(2)
]


def config(tmp_path: Path, **overrides: Any) -> GRPOConfig:
    values: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_steps=1,
        learning_rate=1e-6,
        temperature=0.7,
        loss_type="dapo",
        beta=0.0,
        max_completion_length=12,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        use_cpu=True,
        seed=0,
        bf16=False,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def sampled(policy: HFPolicy, noise: float = 0.0) -> list[Trajectory]:
    """Two groups of two one-turn rollouts sampled from `policy`; `noise` shifts the logged
    logprobs, as a stale or mismatched behaviour policy would."""
    rng = random.Random(0)
    out = []
    for g in range(2):
        for i in range(2):
            gen = policy.generate(
                [{"role": "user", "content": f"q{g} {i}"}],
                Sampling(temperature=0.7, max_new_tokens=12, seed=10 * g + i),
            )
            turn = Transition(
                trajectory_id=f"{g}/{i}",
                group_id=str(g),
                node="planner",
                turn=1,
                messages=[],
                output=gen.text,
                parse_status="ok",
                seconds=0.0,
                prompt_ids=gen.prompt_ids,
                completion_ids=gen.completion_ids,
                logprobs=[lp + rng.gauss(0, noise) for lp in gen.logprobs or []],
            )
            out.append(
                Trajectory(
                    trajectory_id=f"{g}/{i}",
                    group_id=str(g),
                    question="q",
                    reference="r",
                    answer="a",
                    final_text="a",
                    reward=float(i == g),
                    transitions=[turn],
                )
            )
    return out
