"""Provenance: rows sampled otherwise than the trainer samples are refused, at every entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from provenance_setup import TRAINER, rollout, turn
from stand_in_server import Recorded, Reply, stand_in_server

from flowlearn.engine.sampling import Sampling
from flowlearn.engine.server import ServerPolicy
from flowlearn.nodes import policy_transition
from flowlearn.training import Trajectory, build_flow_grpo_rows


def group(**sampling: Any) -> list[Trajectory]:
    """Rewards 1, 0; the second trajectory's second turn carries `sampling`."""
    return [
        rollout("t0", 1.0, [turn("t0", 1, temperature=0.7)]),
        rollout("t1", 0.0, [turn("t1", 1, temperature=0.7), turn("t1", 2, **sampling)]),
    ]


def test_a_row_sampled_at_another_temperature_is_refused() -> None:
    with pytest.raises(ValueError) as refused:
        build_flow_grpo_rows(group(temperature=0.5), sampling=TRAINER)
    message = str(refused.value)
    assert "trajectory 't1' turn 2" in message
    assert "temperature 0.5" in message and "temperature 0.7" in message
    accepted = build_flow_grpo_rows(group(temperature=0.7), sampling=TRAINER)
    assert accepted.stats["rows"] == 3
    unrecorded = build_flow_grpo_rows([rollout("u", 1.0, [turn("u", 1)])], sampling=TRAINER)
    assert unrecorded.stats["rows"] == 1  # no recorded sampling: nothing to check against


@pytest.mark.parametrize(
    ("sampling", "refusal"),
    [
        ({"top_p": 0.9, "logprobs_mode": "processed"}, "processed logprobs"),
        ({"top_p": 1.0, "logprobs_mode": "processed"}, None),  # no nucleus: processed = full
        ({"top_p": 0.9}, None),  # HFPolicy: full-distribution logprobs at any top_p
        ({"top_p": 0.9, "temperature": 1.0, "logprobs_mode": "raw"}, "temperature 1.0"),
        ({"top_p": 1.0, "logprobs_mode": "raw"}, "raw logprobs"),  # raw at 0.7: untempered
    ],
)
def test_processed_logprobs_under_top_p_are_refused(
    sampling: dict[str, Any], refusal: str | None
) -> None:
    if refusal is None:
        assert build_flow_grpo_rows(group(**sampling), sampling=TRAINER).stats["rows"] == 3
        return
    with pytest.raises(ValueError, match=refusal) as refused:
        build_flow_grpo_rows(group(**sampling), sampling=TRAINER)
    assert "trajectory 't1' turn 2" in str(refused.value)


def test_raw_logprobs_at_temperature_1_train_with_a_trainer_at_1() -> None:
    data = [
        rollout("a", 1.0, [turn("a", 1, temperature=1.0, top_p=0.9, logprobs_mode="raw")]),
        rollout("b", 0.0, [turn("b", 1, temperature=1.0, top_p=0.9, logprobs_mode="raw")]),
    ]
    assert build_flow_grpo_rows(data, sampling=Sampling(temperature=1.0)).stats["rows"] == 2


def vllm_reply(request: Recorded) -> Reply:
    choice = {
        "message": {"role": "assistant", "content": "ok"},
        "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.4}]},
        "token_ids": [7],
    }
    return Reply(200, {"choices": [choice], "prompt_token_ids": [1, 2]})


def test_the_server_policy_records_processed_logprobs_and_training_refuses_them() -> None:
    with stand_in_server(vllm_reply) as server:
        policy = ServerPolicy(f"{server.url}/v1", "tiny", api_key_env=None)
        nucleus = policy.generate(
            [{"role": "user", "content": "hi"}], Sampling(temperature=0.7, top_p=0.9)
        )
        full = policy.generate(
            [{"role": "user", "content": "hi"}], Sampling(temperature=0.7, top_p=1.0)
        )
        policy.close()
    assert nucleus.sampling["logprobs_mode"] == "processed" and nucleus.token_faithful

    def stored(gen: Any) -> list[Trajectory]:
        calls = [policy_transition("planner", 1, [], gen) for _ in range(2)]
        for i, call in enumerate(calls):
            call["trajectory_id"] = f"s{i}"
        return [rollout("s0", 1.0, calls[:1]), rollout("s1", 0.0, calls[1:])]

    with pytest.raises(ValueError, match=r"trajectory 's0' turn 1 has processed.*top-p 0\.9"):
        build_flow_grpo_rows(stored(nucleus), sampling=TRAINER)
    assert build_flow_grpo_rows(stored(full), sampling=TRAINER).stats["rows"] == 2


@pytest.mark.slow
def test_the_trainer_refuses_offline_rows_sampled_otherwise_and_logs_what_it_cut(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from flowlearn.engine.local import HFPolicy
    from flowlearn.training.trainer import FlowGRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    policy = HFPolicy(model, tokenizer)

    def sampled(temperature: float) -> list[Trajectory]:
        out = []
        for i, reward in enumerate([1.0, 0.0]):
            messages = [{"role": "user", "content": f"pick {i}"}]
            gen = policy.generate(messages, Sampling(temperature=temperature, max_new_tokens=6))
            call = policy_transition("planner", 1, messages, gen)
            call["trajectory_id"] = f"t{i}"
            out.append(rollout(f"t{i}", reward, [call]))
        return out

    def trainer(data: list[Trajectory]) -> Any:
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=2,
            num_generations=2,
            max_steps=1,
            temperature=0.7,
            loss_type="dapo",
            beta=0.0,
            max_completion_length=2,  # cuts every 6-token completion
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
        )
        return FlowGRPOTrainer.offline(
            model, args=args, trajectories=data, processing_class=tokenizer
        )

    with pytest.raises(ValueError, match=r"trajectory 't0' turn 1 was sampled at temperature 0\.5"):
        trainer(sampled(0.5)).train()
    matching = trainer(sampled(0.7))
    matching.train()
    (logged,) = [h for h in matching.state.log_history if "flow/rows" in h]
    assert logged["flow/rows"] == 2 and logged["flow/rows_cut"] == 2
    assert logged["flow/rows_dropped"] == logged["flow/trajectories_dropped"] == 0
