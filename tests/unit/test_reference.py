"""The KL reference is the model in memory at the start, never its checkpoint rebuilt from disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from offline_setup import CASES, CONTEXT, sampled
from offline_setup import config as offline_config
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig
from trl.trainer.callbacks import SyncRefModelCallback
from trl.trainer.utils import add_fused_lm_head

from flowlearn.engine.local import HFPolicy
from flowlearn.training.model import forward_logps
from flowlearn.training.trainer import FlowGRPOTrainer


def config(tmp_path: Path, **overrides: Any) -> GRPOConfig:
    """The shared offline config, with lr 1e-2 (one step visibly leaves the reference), beta 0.1."""
    return offline_config(tmp_path, **{"learning_rate": 1e-2, "beta": 0.1, **overrides})


def perturbed(folder: Path) -> Any:
    """The tiny model with its weights changed after loading: memory no longer equals disk."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return model


@pytest.mark.slow
def test_the_reference_is_the_modified_model_in_memory(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = perturbed(tiny_model_dir)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path),
        trajectories=sampled(HFPolicy(model, tokenizer)),
        context=CONTEXT,
        processing_class=tokenizer,
    )
    reference = trainer.accelerator.unwrap_model(trainer.ref_model)
    assert reference is not model and trainer.beta == 0.1 == trainer.args.beta
    for name, value in reference.state_dict().items():
        assert torch.equal(value, start[name]), name  # the weights in memory, not on disk
    batch = trainer._generate_and_score_completions(CASES)
    mask = batch["completion_mask"].bool()
    policy = forward_logps(trainer, trainer.model, batch)
    assert torch.equal(batch["ref_per_token_logps"][mask], policy[mask])  # KL 0 at step 0

    trainer.train()
    assert not torch.equal(model.state_dict()["lm_head.weight"], start["lm_head.weight"])
    for name, value in reference.state_dict().items():
        assert torch.equal(value, start[name]), name  # frozen while the policy moved
    assert not any(p.requires_grad for p in reference.parameters())
    after = trainer._generate_and_score_completions(CASES)  # rows in a new order
    mask = after["completion_mask"].bool()
    started = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    started.load_state_dict(start)  # the model as training started, built independently
    add_fused_lm_head(started, temperature=0.7)
    expected = forward_logps(trainer, started, after)
    assert torch.allclose(after["ref_per_token_logps"][mask], expected[mask], atol=1e-6)
    moved = forward_logps(trainer, trainer.model, after)
    assert not torch.allclose(moved[mask], expected[mask], atol=1e-3)
    logged = [h for h in trainer.state.log_history if "kl" in h]
    assert logged and logged[0]["kl"] == pytest.approx(0.0, abs=1e-6)


def test_a_model_whose_folder_is_gone_trains_with_beta(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    # As a GGUF planner (loaded from a file, no model folder) or a model built in memory.
    model.config._name_or_path = str(tmp_path / "nowhere")
    model.config.name_or_path = str(tmp_path / "nowhere")
    before = model.lm_head.weight.detach().clone()
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, max_steps=2, sync_ref_model=True, ref_model_sync_steps=1),
        trajectories=sampled(HFPolicy(model, tokenizer)),
        context=CONTEXT,
        processing_class=tokenizer,
    )
    assert any(isinstance(c, SyncRefModelCallback) for c in trainer.callback_handler.callbacks)
    trainer.train()
    assert not torch.equal(model.lm_head.weight, before)
    assert [h["kl"] for h in trainer.state.log_history if "kl" in h]


@pytest.mark.slow
def test_under_lora_the_reference_is_the_base_without_a_copy(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from peft import LoraConfig, get_peft_model

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = perturbed(tiny_model_dir)
    data = sampled(HFPolicy(base, tokenizer))
    model = get_peft_model(
        base, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)
    )
    trainer = FlowGRPOTrainer.offline(
        model, args=config(tmp_path), trajectories=data, context=CONTEXT, processing_class=tokenizer
    )
    assert trainer.ref_model is None  # no second copy of the weights
    batch = trainer._generate_and_score_completions(CASES)
    mask = batch["completion_mask"].bool()
    with model.disable_adapter():
        plain = forward_logps(trainer, trainer.model, batch)
    policy = forward_logps(trainer, trainer.model, batch)
    # TRL copies a pretrained (here non-zero) adapter as "ref": the model as it started.
    assert torch.allclose(batch["ref_per_token_logps"][mask], policy[mask], atol=1e-6)
    assert not torch.allclose(plain[mask], policy[mask])
