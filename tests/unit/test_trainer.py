from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from fakes import FakeChatModel
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import exact_match
from flowlearn.graphs import Context
from flowlearn.nodes.policies.hf import HFPolicy
from flowlearn.nodes.schema.sampling import Sampling
from flowlearn.training import TrajectoryStore, build_flow_grpo_rows
from flowlearn.training.metrics import read_metrics
from flowlearn.training.trainer import FlowGRPOTrainer
from flowlearn.training.trajectory import Trajectory, Transition


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


def config(tmp_path: Path, **overrides: Any) -> GRPOConfig:
    values: dict[str, Any] = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_steps=2,
        learning_rate=1e-3,
        temperature=0.7,
        loss_type="dapo",
        beta=0.0,
        max_completion_length=16,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        use_cpu=True,
        seed=0,
        bf16=False,  # fp32, so TRL's logprobs match the logged ones to float precision
    )
    values.update(overrides)
    return GRPOConfig(**values)


def load(tiny_model_dir: Path) -> tuple[Any, Any]:
    return (
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )


# planner_max_new_tokens is max_completion_length: training refuses two values for one budget
CONTEXT = Context(max_turns=2, planner_temperature=0.7, planner_max_new_tokens=16)
CASES = [Case(str(i), f"Capital {i}?", "paris") for i in range(4)]


def scorer(answer: str, case: Case):  # type: ignore[no-untyped-def]
    return exact_match(answer, case.reference)


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


def perturbed_trajectories(policy: HFPolicy, seed: int) -> list[Trajectory]:
    """Real rollouts' tokens with logged logprobs shifted, so importance ratios differ from 1."""
    rng = random.Random(seed)
    out = []
    for g in range(2):
        for i in range(2):
            transitions = []
            for t in range(rng.randint(1, 2)):
                gen = policy.generate(
                    [{"role": "user", "content": f"q{g} {i} {t}"}],
                    Sampling(temperature=0.7, max_new_tokens=6, seed=seed + t),
                )
                transitions.append(
                    Transition(
                        trajectory_id=f"{g}/{i}",
                        group_id=str(g),
                        node="planner",
                        turn=t + 1,
                        messages=[],
                        output=gen.text,
                        parse_status="ok",
                        seconds=0.0,
                        prompt_ids=gen.prompt_ids,
                        completion_ids=gen.completion_ids,
                        logprobs=[lp + rng.gauss(0, 0.2) for lp in gen.logprobs or []],
                    )
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
                    transitions=transitions,
                )
            )
    return out


def test_trl_loss_equals_the_papers_objective(tiny_model_dir: Path, tmp_path: Path) -> None:
    model, tokenizer = load(tiny_model_dir)
    trajectories = perturbed_trajectories(HFPolicy(model, tokenizer), seed=3)
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, epsilon=0.2, epsilon_high=0.3),
        trajectories=trajectories,
        context=CONTEXT,
        processing_class=tokenizer,
    )
    inputs = trainer._generate_and_score_completions(
        [
            {"prompt": "0", "case": '{"id": "0", "query": "0", "reference": null}'},
            {"prompt": "1", "case": '{"id": "1", "query": "1", "reference": null}'},
        ]
    )
    loss = trainer._compute_loss(model, inputs).item()

    rows = build_flow_grpo_rows(trajectories, "paper").rows
    objective = 0.0
    for row in rows:
        ids = torch.tensor([row.prompt_ids + row.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(row.prompt_ids) - 1 : -1] / 0.7
        logps = torch.log_softmax(logits.float(), -1).gather(
            1, torch.tensor(row.completion_ids)[:, None]
        )[:, 0]
        for new, old in zip(logps.tolist(), row.old_logprobs, strict=True):
            r = math.exp(new - old)
            objective += row.token_weight * min(
                r * row.advantage, min(max(r, 0.8), 1.3) * row.advantage
            )
    assert loss == pytest.approx(-objective, abs=1e-5)


def test_offline_training_from_exported_trajectories(tiny_model_dir: Path, tmp_path: Path) -> None:
    from flowlearn.training import export_parquet, read_parquet

    model, tokenizer = load(tiny_model_dir)
    path = export_parquet(
        perturbed_trajectories(HFPolicy(model, tokenizer), seed=5), tmp_path / "t.parquet"
    )
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, max_steps=1),
        trajectories=read_parquet(path),
        context=CONTEXT,
        processing_class=tokenizer,
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()
    assert sum((before[k] - v).abs().sum().item() for k, v in model.state_dict().items()) > 0


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


def sequence_logp(model: Any, prompt: list[int], completion: list[int]) -> float:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
    return float(torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).sum())


def sampled_group(policy: HFPolicy, rewards: list[float]) -> list[Trajectory]:
    out = []
    for i, reward in enumerate(rewards):
        gen = policy.generate(
            [{"role": "user", "content": "pick a tool"}],
            Sampling(temperature=0.7, max_new_tokens=6, seed=i),
        )
        transition = Transition(
            trajectory_id=f"g/{i}",
            group_id="g",
            node="planner",
            turn=1,
            messages=[],
            output=gen.text,
            parse_status="ok",
            seconds=0.0,
            prompt_ids=gen.prompt_ids,
            completion_ids=gen.completion_ids,
            logprobs=gen.logprobs,
        )
        out.append(
            Trajectory(
                trajectory_id=f"g/{i}",
                group_id="g",
                question="q",
                reference="r",
                answer="a",
                final_text="a",
                reward=reward,
                transitions=[transition],
            )
        )
    return out


@pytest.mark.parametrize("rewards", [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
def test_one_step_moves_probability_towards_rewarded_turns(
    tiny_model_dir: Path, tmp_path: Path, rewards: list[float]
) -> None:
    model, tokenizer = load(tiny_model_dir)
    group = sampled_group(HFPolicy(model, tokenizer), rewards)
    before = [
        sequence_logp(model, t.transitions[0]["prompt_ids"], t.transitions[0]["completion_ids"])
        for t in group
    ]
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, max_steps=1, learning_rate=1e-2, weight_decay=0.0, num_generations=4),
        trajectories=group,
        context=CONTEXT,
        processing_class=tokenizer,
    )
    trainer.train()
    after = [
        sequence_logp(model, t.transitions[0]["prompt_ids"], t.transitions[0]["completion_ids"])
        for t in group
    ]
    moved = sum((weights[k] - v).abs().sum().item() for k, v in model.state_dict().items())
    if len(set(rewards)) == 1:  # zero advantages: no gradient, no change
        assert moved == 0.0
        return
    delta = [a - b for a, b in zip(after, before, strict=True)]
    assert min(delta[:2]) > 0 > max(delta[2:]), delta


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
