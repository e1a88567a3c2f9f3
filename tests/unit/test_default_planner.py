"""The default planner: the embedded model with the shipped adapter; default-base without it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from flowlearn.compose import load_local_models
from flowlearn.engine import loading
from flowlearn.engine.loading import load_model_and_tokenizer, untrained_twin

BENCH = Path(__file__).parents[2] / "research" / "default-planner"


@pytest.fixture
def shipped(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Stand the tiny model in for the embedded one, with a trained-looking adapter shipped."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    adapter = get_peft_model(
        model, LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    with torch.no_grad():  # LoRA starts at zero: move B so the adapter changes the model
        for name, weight in adapter.named_parameters():
            if "lora_B" in name:
                weight.normal_(std=0.5)
    folder = tmp_path / "default_planner"
    adapter.save_pretrained(folder)
    monkeypatch.setattr(loading, "SHIPPED_ADAPTER", folder)
    monkeypatch.setattr(loading, "default_model_dir", lambda cache=None: tiny_model_dir)
    return folder


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([[5, 6, 7, 8]])).logits


def test_default_planner_merges_the_shipped_adapter_and_default_base_does_not(
    tiny_model_dir: Path, shipped: Path
) -> None:
    base, _ = load_model_and_tokenizer("default-base", device="cpu")
    trained, _ = load_model_and_tokenizer("default", device="cpu")
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert torch.equal(logits(base), logits(plain))  # default-base: the model as it comes
    assert not torch.allclose(logits(trained), logits(plain), atol=1e-3)
    assert type(trained) is type(plain)  # merged: a plain model, no peft wrapper
    assert trained.config.name_or_path.endswith("+default_planner")
    assert all(p.requires_grad for p in trained.parameters())  # full fine-tuning can train it
    assert untrained_twin("default") == "default-base" and untrained_twin("x/y") == "x/y"


def test_default_planner_engine_is_untrained(tiny_model_dir: Path, shipped: Path) -> None:
    models = load_local_models("default", device="cpu")
    planner, engine = models.planner.model, models.engine.policy.model
    assert planner is not engine
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert torch.equal(logits(engine), logits(plain))
    assert not torch.allclose(logits(planner), logits(plain), atol=1e-3)
    # An engine named outright is that model, and default-base shares one copy with itself.
    same = load_local_models("default-base", device="cpu")
    assert same.planner.model is same.engine.policy.model


def test_default_planner_without_a_shipped_adapter_is_the_base(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(loading, "SHIPPED_ADAPTER", tmp_path / "none")
    monkeypatch.setattr(loading, "default_model_dir", lambda cache=None: tiny_model_dir)
    assert untrained_twin("default") == "default"
    models = load_local_models("default", device="cpu")
    assert models.planner.model is models.engine.policy.model  # one copy


def test_bench_ship_adapter_writes_a_half_precision_copy_that_loads_as_the_default(
    shipped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("ship_adapter", BENCH / "ship_adapter.py")
    assert spec is not None and spec.loader is not None
    ship_adapter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ship_adapter)
    full, _ = load_model_and_tokenizer("default", device="cpu")
    target = tmp_path / "shipped_fp16"
    weights = ship_adapter.ship(shipped, target)
    assert all(t.dtype == torch.float16 for t in load_file(weights).values())
    source = json.loads((target / "SOURCE.json").read_text())
    assert source["from"] == str(shipped) and source["dtype"] == "float16"
    assert source["recipe"] == "examples/learn_tools.yaml"  # the default recipe
    monkeypatch.setattr(loading, "SHIPPED_ADAPTER", target)
    half, _ = load_model_and_tokenizer("default", device="cpu")
    assert torch.allclose(logits(half), logits(full), atol=1e-2)
    with pytest.raises(SystemExit, match="holds no LoRA adapter"):
        ship_adapter.ship(tmp_path / "empty", tmp_path / "nowhere")
    warm = BENCH / "learn_tools_warm.yaml"
    ship_adapter.ship(shipped, tmp_path / "warm", recipe=warm)
    recorded = json.loads((tmp_path / "warm" / "SOURCE.json").read_text())["recipe"]
    assert recorded == "research/default-planner/learn_tools_warm.yaml"  # from the repo root
    with pytest.raises(SystemExit, match=r"--recipe .* is not a file"):
        ship_adapter.ship(shipped, tmp_path / "nowhere", recipe=tmp_path / "missing.yaml")


def test_bench_stack_adapters_joins_a_warm_adapter_to_the_shipped_one_exactly(
    shipped: Path, tmp_path: Path
) -> None:
    spec = importlib.util.spec_from_file_location("stack_adapters", BENCH / "stack_adapters.py")
    assert spec is not None and spec.loader is not None
    stack_adapters = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stack_adapters)
    merged, _ = load_model_and_tokenizer("default", device="cpu", dtype="float32")
    warm = get_peft_model(  # a LoRA trained on the default planner (shipped adapter merged in)
        merged, LoraConfig(r=2, lora_alpha=4, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    with torch.no_grad():
        for name, weight in warm.named_parameters():
            if "lora_B" in name:
                weight.normal_(std=0.5)
    warm.save_pretrained(tmp_path / "warm")
    joined = stack_adapters.stack(tmp_path / "warm", tmp_path / "joined", shipped=shipped)
    assert stack_adapters.check(joined, tmp_path / "warm") < 1e-4  # exact, up to float32
    settings = json.loads((tmp_path / "joined" / "adapter_config.json").read_text())
    assert settings["r"] == 4  # rank 2 + 2: the two adapters side by side
