"""Several trained roles: a LoRA adapter per node on one base, trained together from one outcome."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

import torch
from flow_rows import KeepGradients, toy_config, toy_trajectories
from peft import LoraConfig
from transformers import AutoModelForCausalLM

from flowlearn.engine.adapters import (
    AdapterPolicy,
    active_adapter,
    adapter_names,
    switch_adapter,
)
from flowlearn.engine.local import FrozenBasePolicy, HFPolicy, adapters_off
from flowlearn.engine.sampling import Sampling
from flowlearn.training.roles import with_node_adapters
from flowlearn.training.trainer import FlowGRPOTrainer
from flowlearn.training.trajectories import Trajectory

NODES = ("planner", "verifier")


def two_adapters(tiny_model_dir: Path, seed: int = 0) -> Any:
    """The tiny model with a planner and a verifier adapter, B matrices non-zero."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = with_node_adapters(model, {n: settings for n in NODES})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a fresh LoRA B is zero: every adapter would act as the base
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return peft_model


def as_node(trajectories: list[Trajectory], node: str, prefix: str = "") -> list[Trajectory]:
    """The same trajectories with every transition made by `node` (and groups renamed)."""
    out = []
    for t in trajectories:
        transitions = [{**x, "node": node, "group_id": prefix + t.group_id} for x in t.transitions]
        out.append(
            Trajectory(
                prefix + t.trajectory_id,
                prefix + t.group_id,
                t.question,
                t.reference,
                t.answer,
                t.final_text,
                t.reward,
                transitions=transitions,  # type: ignore[arg-type]
            )
        )
    return out


def test_every_adapter_stays_trainable_and_each_node_generates_with_its_own(
    tiny_model_dir: Path,
) -> None:
    model = two_adapters(tiny_model_dir)
    assert adapter_names(model) == ["planner", "verifier"]
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert lora and all(p.requires_grad for p in lora)
    base = HFPolicy(model, __import__("transformers").AutoTokenizer.from_pretrained(tiny_model_dir))
    ids = [5, 6, 7, 8]
    with torch.no_grad():
        outputs = {}
        for node in NODES:
            with active_adapter(model, node):
                outputs[node] = model(torch.tensor([ids])).logits
        with adapters_off(model):
            outputs["base"] = model(torch.tensor([ids])).logits
    assert not torch.allclose(outputs["planner"], outputs["verifier"])
    assert not torch.allclose(outputs["planner"], outputs["base"])
    assert all(p.requires_grad for p in lora)  # PEFT's set_adapter would freeze the other
    sampling = Sampling(temperature=0.0, max_new_tokens=4)
    planner, verifier = AdapterPolicy(base, "planner"), AdapterPolicy(base, "verifier")
    frozen = FrozenBasePolicy(base)
    for policy, scope in ((planner, "planner"), (verifier, "verifier")):
        generation = policy.generate_ids(ids, sampling)
        switch_adapter(model, scope)
        with torch.no_grad():
            logits = model(torch.tensor([ids + generation.completion_ids[:-1]])).logits[0]
        picked = logits[len(ids) - 1 :].argmax(-1).tolist()
        assert picked[: len(generation.completion_ids)] == generation.completion_ids
        assert generation.policy_version.endswith(f":{scope}")
    assert frozen.generate_ids(ids, sampling).policy_version.endswith(":base")
    with pytest.raises(ValueError, match="no adapter"):
        AdapterPolicy(base, "generator")


def test_a_rows_gradient_reaches_only_its_nodes_adapter(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    for trained, other in (("planner", "verifier"), ("verifier", "planner")):
        model = two_adapters(tiny_model_dir)
        trajectories = as_node(toy_trajectories(model), trained)
        keep = KeepGradients()
        trainer = FlowGRPOTrainer.offline(
            model,
            args=toy_config(tmp_path / trained),
            trajectories=trajectories,
            nodes=list(NODES),
            callbacks=[keep],
        )
        trainer.train()
        (gradient,) = keep.steps
        mine = {n for n, _ in model.named_parameters() if f".{trained}." in n and "lora_" in n}
        theirs = {n for n, _ in model.named_parameters() if f".{other}." in n and "lora_" in n}
        assert any(float(gradient[n].abs().sum()) > 0 for n in mine if n in gradient)
        assert all(float(gradient[n].abs().sum()) == 0 for n in theirs if n in gradient)
        assert not any("lora_" not in n for n in gradient)  # the base is frozen


def with_adapters(tiny_model_dir: Path, nodes: tuple[str, ...]) -> Any:
    """The tiny model with an adapter per node; each weight seeded by its name alone, so a
    node's adapter starts the same whichever other adapters the model carries."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = with_node_adapters(model, {n: settings for n in nodes})
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                seed = zlib.crc32(name.encode())
                generator = torch.Generator().manual_seed(seed)
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return peft_model


def adapter_weights(model: Any, node: str) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if "lora_" in n and f".{node}." in n
    }


def test_two_nodes_on_disjoint_rows_train_as_two_one_node_trainings(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    reference = with_adapters(tiny_model_dir, NODES)
    planner_rows = as_node(toy_trajectories(reference, seed=0), "planner")
    verifier_rows = as_node(toy_trajectories(reference, seed=1), "verifier", prefix="v")
    together = with_adapters(tiny_model_dir, NODES)
    FlowGRPOTrainer.offline(
        together,
        args=toy_config(tmp_path / "both", per_device_train_batch_size=16),
        trajectories=planner_rows + verifier_rows,
        nodes=list(NODES),
    ).train()
    for node, rows in (("planner", planner_rows), ("verifier", verifier_rows)):
        alone = with_adapters(tiny_model_dir, (node,))
        start = adapter_weights(alone, node)
        FlowGRPOTrainer.offline(
            alone, args=toy_config(tmp_path / node), trajectories=rows, nodes=[node]
        ).train()
        after_alone, after_together = adapter_weights(alone, node), adapter_weights(together, node)
        moved = sum(float((after_alone[k] - start[k]).abs().max()) for k in start)
        assert moved > 1e-3  # the update did something
        for key, value in after_alone.items():
            assert torch.allclose(after_together[key], value, atol=1e-5, rtol=0), key


def test_resume_restores_every_adapter_and_the_optimizer(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    trajectories = as_node(toy_trajectories(with_adapters(tiny_model_dir, NODES)), "planner")
    trajectories += as_node(
        toy_trajectories(with_adapters(tiny_model_dir, NODES), seed=1), "verifier", "v"
    )
    adam = dict(
        per_device_train_batch_size=16, max_steps=2, learning_rate=1e-2, optim="adamw_torch",
        save_strategy="steps", save_steps=1,
    )  # fmt: skip

    def trainer(out: str, model: Any, **extra: Any) -> FlowGRPOTrainer:
        return FlowGRPOTrainer.offline(
            model,
            args=toy_config(tmp_path / out, **{**adam, **extra}),
            trajectories=trajectories,
            nodes=list(NODES),
        )

    straight = with_adapters(tiny_model_dir, NODES)
    trainer("straight", straight).train()
    first = with_adapters(tiny_model_dir, NODES)
    trainer("resumed", first, max_steps=1).train()
    checkpoint = tmp_path / "resumed" / "checkpoint-1"
    assert sorted(
        p.name for p in checkpoint.iterdir() if (p / "adapter_config.json").is_file()
    ) == [
        "planner",
        "verifier",
    ]
    resumed = with_adapters(tiny_model_dir, NODES)
    second = trainer("resumed", resumed)
    second.train(resume_from_checkpoint=str(checkpoint))
    state = second.optimizer.state_dict()["state"]
    assert state and all(int(s["step"]) == 2 for s in state.values())  # Adam's moments came back
    for node in NODES:
        expected, got = adapter_weights(straight, node), adapter_weights(resumed, node)
        for key, value in expected.items():
            assert torch.allclose(got[key], value, atol=1e-5, rtol=0), key
