"""Training precision: fp32 master weights, old logprobs from the training forward, no dropout."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from offline_setup import CASES, CONTEXT, sampled
from offline_setup import config as offline_config
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from flowlearn.engine.local import HFPolicy
from flowlearn.training.config import FlowGRPOConfig
from flowlearn.training.model import forward_logps, upcast_trainable
from flowlearn.training.rollouts import Replay
from flowlearn.training.trainer import FlowGRPOTrainer
from flowlearn.training.trajectories import Trajectory


def config(tmp_path: Path, **overrides: Any) -> GRPOConfig:
    """The shared offline config: 3 steps at the paper's lr 1e-6, below a bf16 weight's step."""
    return offline_config(tmp_path, **{"max_steps": 3, "learning_rate": 1e-6, **overrides})


def train_delta(model: Any, tokenizer: Any, args: GRPOConfig, data: list[Trajectory]) -> Any:
    """Train `model` offline on `data`; return the flat change of its weights."""
    before = torch.cat([p.detach().float().flatten().clone() for p in model.parameters()])
    trainer = FlowGRPOTrainer.offline(
        model, args=args, trajectories=data, context=CONTEXT, processing_class=tokenizer
    )
    trainer.train()
    return torch.cat([p.detach().float().flatten() for p in model.parameters()]) - before


def test_bf16_weights_move_as_in_fp32_at_the_papers_learning_rate(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    # One starting point for both runs: the bf16 weights, exactly representable in fp32.
    bf16 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    fp32 = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).float()
    data = sampled(HFPolicy(fp32, tokenizer))
    mixed = train_delta(bf16, tokenizer, config(tmp_path / "bf16", bf16=True), data)
    full = train_delta(fp32, tokenizer, config(tmp_path / "fp32"), data)

    assert {p.dtype for p in bf16.parameters()} == {torch.float32}  # the master weights
    moved, moved_fp32 = (mixed != 0).float().mean().item(), (full != 0).float().mean().item()
    # Stepping the bf16 weights themselves moved 2.3% of them here, fp32 moves them all.
    assert moved_fp32 > 0.99 and moved > 0.99
    assert torch.nn.functional.cosine_similarity(mixed, full, dim=0) > 0.99
    assert (mixed - full).norm() < 0.2 * full.norm()  # bf16 compute: a close, not equal, step


def test_only_trainable_weights_are_upcast(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    model.model.embed_tokens.requires_grad_(False)  # frozen, like a LoRA base or a reference
    cast = upcast_trainable(model)
    assert cast == sum(1 for p in model.parameters() if p.requires_grad) > 0
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert upcast_trainable(model) == 0  # idempotent


def test_the_live_planner_samples_with_the_upcast_weights(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    policy = HFPolicy(model, tokenizer)  # the same object the trainer upcasts in place
    data = sampled(policy)  # sampled in bf16, before training starts
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, bf16=True),
        trajectories=data,
        context=CONTEXT,
        processing_class=tokenizer,
    )
    assert policy.model is model and model.dtype == torch.float32
    trainer.source = Replay.of(sampled(policy))  # rollouts now sample with the fp32 weights
    batch = trainer._generate_and_score_completions(CASES)
    trained = forward_logps(trainer, trainer.model, batch)  # under bf16 autocast, as the loss
    mask = batch["completion_mask"].bool()
    assert int(mask.sum()) > 0
    # The logged (fp32) and the training (bf16 compute) logprobs differ by bf16 numerics only.
    gap = (batch["old_per_token_logps"] - trained).abs()[mask]
    assert 0 < gap.mean() < 0.05


def test_recomputed_old_logprobs_come_from_the_training_forward(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    data = sampled(HFPolicy(model, tokenizer), noise=0.2)
    args = FlowGRPOConfig(
        trajectories="unused.jsonl",  # offline: the trainer is handed `data` itself
        questions_per_step=2,
        num_generations=2,
        **{k: v for k, v in config(tmp_path).to_dict().items() if k in KEEP},
        recompute_old_logprobs=True,
    )
    trainer = FlowGRPOTrainer.offline(
        model, args=args, trajectories=data, context=CONTEXT, processing_class=tokenizer
    )
    assert trainer.recompute_old_logprobs
    batch = trainer._generate_and_score_completions(CASES)
    mask = batch["completion_mask"].bool()
    fresh = forward_logps(trainer, trainer.model, batch)
    assert torch.allclose(batch["old_per_token_logps"][mask], fresh[mask], atol=1e-6)
    logged = [lp for t in data for lp in t.transitions[0]["logprobs"] or []]
    clean = [
        lp for t in sampled(HFPolicy(model, tokenizer)) for lp in t.transitions[0]["logprobs"] or []
    ]
    noise = sum(abs(a - b) for a, b in zip(logged, clean, strict=True)) / len(logged)
    (gap,) = trainer._metrics["train"]["flow/old_logprob_gap"]
    assert gap == pytest.approx(noise, abs=1e-4)  # the metric is mean |logged - recomputed|

    off = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path / "off"),
        trajectories=data,
        context=CONTEXT,
        processing_class=tokenizer,
    )
    assert not off.recompute_old_logprobs  # a plain GRPOConfig: the logged ones, as before
    kept = off._generate_and_score_completions(CASES)["old_per_token_logps"]
    assert sorted(kept[kept != 0].tolist()) == pytest.approx(sorted(logged), abs=1e-6)


KEEP = {"output_dir", "max_steps", "learning_rate", "temperature", "max_completion_length"}
KEEP |= {"report_to", "save_strategy", "gradient_checkpointing", "use_cpu", "seed", "beta"}


def test_dropout_is_off_by_default_and_a_plain_config_keeping_it_is_warned(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = sampled(HFPolicy(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer))

    def with_dropout() -> Any:
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        model.model.dropout = torch.nn.Dropout(0.1)  # Qwen2 has none of its own modules
        return model

    flow = FlowGRPOConfig(
        trajectories="unused.jsonl",
        questions_per_step=2,
        num_generations=2,
        **{k: v for k, v in config(tmp_path).to_dict().items() if k in KEEP},
    )
    assert flow.disable_dropout
    model = with_dropout()
    FlowGRPOTrainer.offline(
        model, args=flow, trajectories=data, context=CONTEXT, processing_class=tokenizer
    )
    assert model.model.dropout.p == 0
    kept = with_dropout()
    with caplog.at_level(logging.WARNING, logger="flowlearn.training.model"):
        FlowGRPOTrainer.offline(
            kept,
            args=config(tmp_path / "plain"),  # TRL's GRPOConfig: disable_dropout=False
            trajectories=data,
            context=CONTEXT,
            processing_class=tokenizer,
        )
    assert kept.model.dropout.p == 0.1
    assert "set disable_dropout=True" in caplog.text


def test_training_loads_full_fine_tuning_in_fp32_after_counting_from_the_config(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from flowlearn.compose import training_spec
    from flowlearn.engine.loading import parameter_count
    from flowlearn.training.model import load_planner

    flow = FlowGRPOConfig(
        trajectories="unused.jsonl", planner=str(tiny_model_dir), output_dir=str(tmp_path)
    )
    model, _, lora = load_planner(flow, training_spec(flow).planner, None, "cpu")
    assert parameter_count(tiny_model_dir) == model.num_parameters()  # weights never loaded
    assert lora is False and model.dtype == torch.float32  # full fine-tuning: fp32 weights
    flow.lora = True
    assert load_planner(flow, training_spec(flow).planner, None, "cpu")[2] is True
