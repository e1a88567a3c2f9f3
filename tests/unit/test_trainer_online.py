"""Online Flow-GRPO training in the flow: the planner learns, bad settings and dropped steps."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from trainer_setup import CONTEXT, config, load

from fakes import FakeChatModel
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import exact_match
from flowlearn.training import TrajectoryStore
from flowlearn.training.trainer import FlowGRPOTrainer, read_metrics


@tool
def lookup(query: str) -> str:
    """Look up a fact."""
    return "paris"


def engine(seed: int = 0) -> FakeChatModel:
    rng = random.Random(seed)

    def respond(messages: Any, tools: list[dict[str, Any]]) -> Any:
        if tools:
            return AIMessage(
                content="", tool_calls=[{"name": "lookup", "args": {"query": "q"}, "id": "1"}]
            )
        return f"Conclusion: STOP <answer>{rng.choice(['paris', 'rome'])}</answer>"

    return FakeChatModel(respond=respond)


CASES = [Case(str(i), f"Capital {i}?", "paris") for i in range(4)]


def scorer(answer: str, case: Case):  # type: ignore[no-untyped-def]
    return exact_match(answer, case.reference)


@pytest.mark.slow
def test_online_training_updates_the_planner_in_the_flow(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model, tokenizer = load(tiny_model_dir)
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    trainer = FlowGRPOTrainer.online(
        model,
        # 2 questions x 4 rollouts per step: the weights stay put only if every group's 4
        # coin-flip answers agree, odds 8**-4
        args=config(tmp_path, per_device_train_batch_size=8, num_generations=4),
        engine=engine(),
        tools=[lookup],
        scorer=scorer,
        cases=CASES,
        context=CONTEXT,
        processing_class=tokenizer,
        rollout_store=store,
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()
    changed = sum((before[k] - v).abs().sum().item() for k, v in model.state_dict().items())
    assert changed > 0
    rollouts = store.load()
    assert len(rollouts) == 2 * 2 * 4  # 2 steps x 2 questions x G=4
    versions = {
        t["policy_version"] for r in rollouts for t in r.transitions if t["node"] == "planner"
    }
    assert {v.rsplit("@", 1)[1] for v in versions} == {"0", "1"}  # step 2 used updated weights
    logged = [h for h in trainer.state.log_history if "flow/rows" in h]
    assert len(logged) == 2 and all(h["flow/tokens"] > 0 for h in logged)
    out = tmp_path / "out"
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    health = {
        "flow/mean_reward",
        "flow/zero_variance_share",
        "flow/format_error_rate",
        "flow/mean_turns",
        "flow/completion_length",
        "flow/rollout_seconds",
        "flow/update_seconds",
        "entropy",
        "clip_ratio/region_mean",
        "group_rewards",
    }
    assert health <= set(records[0]), health - set(records[0])
    assert set(records[0]["group_rewards"]) <= {c.id for c in CASES}
    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("overrides", "kwargs", "message"),
    [
        ({"temperature": 1.0}, {}, "differs from the planner temperature"),
        ({"loss_type": "grpo"}, {}, "loss_type='dapo'"),
        (
            {"gradient_accumulation_steps": 2, "steps_per_generation": 1},
            {},
            "must not span two generation batches",
        ),
        ({}, {"cases": CASES[:1]}, "only 1 questions were given"),
        ({"per_device_train_batch_size": 16}, {}, "each step takes 8 questions"),
    ],
)
def test_contradictory_settings_are_errors(
    tiny_model_dir: Path,
    tmp_path: Path,
    overrides: dict[str, Any],
    kwargs: dict[str, Any],
    message: str,
) -> None:
    model, tokenizer = load(tiny_model_dir)
    with pytest.raises(ValueError, match=message):
        FlowGRPOTrainer.online(
            model,
            args=config(tmp_path, **overrides),
            engine=engine(),
            tools=[lookup],
            scorer=scorer,
            context=CONTEXT,
            processing_class=tokenizer,
            **{"cases": CASES, **kwargs},
        )


def test_a_step_whose_rollouts_were_all_dropped_is_skipped(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    def failing_judge(answer: str, case: Case) -> Any:
        raise TimeoutError("judge timed out")

    model, tokenizer = load(tiny_model_dir)
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    trainer = FlowGRPOTrainer.online(
        model,
        args=config(tmp_path, weight_decay=0.1),
        engine=engine(),
        tools=[lookup],
        scorer=failing_judge,
        cases=CASES,
        context=CONTEXT,
        processing_class=tokenizer,
        rollout_store=store,
        reward_errors="drop",
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()  # no exception: the run goes on
    assert trainer.state.global_step == 2
    for key, value in model.state_dict().items():  # no update, not even weight decay
        assert torch.equal(before[key], value), key
    rollouts = store.load()
    assert len(rollouts) == 8 and all("judge timed out" in (r.reward_error or "") for r in rollouts)
    skipped = [h["flow/skipped_update"] for h in trainer.state.log_history if "flow/rows" in h]
    assert skipped == [1.0, 1.0]


def planner_draws(tiny_model_dir: Path, tmp_path: Path, seed: int) -> list[Any]:
    """One step of online training with no context given: its planner completions and seeds."""
    model, tokenizer = load(tiny_model_dir)
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    args = config(tmp_path, per_device_train_batch_size=4, num_generations=2, max_steps=1)
    args.seed, args.temperature = seed, 0.7
    trainer = FlowGRPOTrainer.online(
        model,
        args=args,
        engine=engine(),
        tools=[lookup],
        scorer=scorer,
        cases=CASES,
        processing_class=tokenizer,
        rollout_store=store,
    )
    assert trainer.flow_context.seed == seed  # TRL's seed seeds the rollouts
    trainer.train()
    return sorted(
        (t["sampling"]["seed"], tuple(t["completion_ids"]))
        for r in store.load()
        for t in r.transitions
        if t["node"] == "planner"
    )


@pytest.mark.slow
def test_trls_seed_seeds_the_rollouts_so_a_run_repeats(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    first = planner_draws(tiny_model_dir, tmp_path / "a", seed=3)
    assert all(seed is not None for seed, _ in first)
    assert len({seed for seed, _ in first}) == len(first)  # every call its own draw
    assert planner_draws(tiny_model_dir, tmp_path / "b", seed=3) == first
    # rollout k draws under seed + k, so seed 4's rollout 0 is seed 3's rollout 1: some calls
    # coincide, the run does not
    assert planner_draws(tiny_model_dir, tmp_path / "c", seed=4) != first


def test_each_step_of_a_seeded_run_draws_afresh() -> None:
    from flowlearn.training.rollouts import step_seed

    seeds = {
        step_seed(5, step, rank) + k for step in range(200) for rank in (0, 1) for k in range(64)
    }
    assert len(seeds) == 200 * 2 * 64  # no (step, rank, rollout) of a group shares a seed
    assert step_seed(5, 3, 1) == step_seed(5, 3, 1) != step_seed(6, 3, 1)
