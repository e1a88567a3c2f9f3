"""A model's own generation config cannot reshape sampling: only `Sampling`'s fields count."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.local import HFPolicy, stream_text
from flowlearn.engine.sampling import Generation, Sampling

torch = pytest.importorskip("torch")

MESSAGES = [{"role": "user", "content": "What is 17 * 23? Tool Name: python"}]
PENALTIES = {
    "repetition_penalty": 1.5,
    "no_repeat_ngram_size": 2,
    "top_k": 3,
    "min_p": 0.3,
    "typical_p": 0.5,
    "suppress_tokens": [5, 6, 7],
}


@pytest.fixture(scope="module")
def penalised_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a `generation_config.json` full of logits processors."""
    folder = tmp_path_factory.mktemp("penalised") / "model"
    shutil.copytree(tiny_model_dir, folder)
    config_path = folder / "generation_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    config_path.write_text(json.dumps({**config, **PENALTIES}))
    return folder


@pytest.fixture(scope="module")
def single(penalised_dir: Path) -> HFPolicy:
    policy = HFPolicy.from_pretrained(penalised_dir, device="cpu")
    assert policy.model.generation_config.repetition_penalty == 1.5  # the penalties did load
    return policy


@pytest.fixture(scope="module")
def batched(single: HFPolicy) -> Iterator[BatchingPolicy]:
    policy = BatchingPolicy(single, max_batch_size=4, max_wait_s=0.05)
    yield policy
    policy.close()


def fresh_logits(policy: HFPolicy, gen: Generation) -> torch.Tensor:
    """The raw next-token logits at each completion step, from one fresh forward pass."""
    assert gen.prompt_ids and gen.completion_ids
    ids = torch.tensor([gen.prompt_ids + gen.completion_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0].float()
    start = len(gen.prompt_ids)
    return logits[start - 1 : start - 1 + len(gen.completion_ids)]


@pytest.mark.parametrize("path", ["single", "batched"])
def test_greedy_is_the_plain_argmax(path: str, single: HFPolicy, batched: BatchingPolicy) -> None:
    policy = single if path == "single" else batched
    gen = policy.generate(MESSAGES, Sampling(temperature=0.0, max_new_tokens=32))
    assert gen.completion_ids
    argmax = fresh_logits(single, gen).argmax(-1).tolist()
    assert gen.completion_ids == argmax
    repeats = len(argmax) - len(set(argmax))
    assert repeats > 0  # the penalties would have changed this completion


@pytest.mark.parametrize("path", ["single", "batched"])
@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_sampled_logprobs_are_the_tempered_softmax(
    path: str, temperature: float, single: HFPolicy, batched: BatchingPolicy
) -> None:
    policy = single if path == "single" else batched
    gen = policy.generate(MESSAGES, Sampling(temperature=temperature, max_new_tokens=32, seed=11))
    scaled = torch.log_softmax(fresh_logits(single, gen) / temperature, -1)
    expected = scaled.gather(1, torch.tensor(gen.completion_ids)[:, None])[:, 0]
    assert torch.allclose(expected, torch.tensor(gen.logprobs), atol=1e-4)


def test_single_sampling_ignores_the_models_config(single: HFPolicy, tiny_model_dir: Path) -> None:
    plain = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    sampling = Sampling(temperature=1.0, max_new_tokens=32, seed=5)
    assert single.generate(MESSAGES, sampling).completion_ids == (
        plain.generate(MESSAGES, sampling).completion_ids
    )


def test_streaming_ignores_the_models_config(single: HFPolicy) -> None:
    sampling = Sampling(temperature=0.0, max_new_tokens=32)
    streamed = "".join(stream_text(single, MESSAGES, sampling))
    gen = single.generate(MESSAGES, sampling)
    assert gen.completion_ids == fresh_logits(single, gen).argmax(-1).tolist()
    assert streamed == gen.text


def test_a_lora_model_and_its_frozen_base_ignore_the_models_config(penalised_dir: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from flowlearn.engine.local import FrozenBasePolicy

    loaded = HFPolicy.from_pretrained(penalised_dir, device="cpu")
    lora = get_peft_model(loaded.model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    trained = HFPolicy(lora, loaded.tokenizer)
    before = lora.get_base_model().generation_config
    for policy in (trained, FrozenBasePolicy(trained)):
        gen = policy.generate(MESSAGES, Sampling(temperature=0.0, max_new_tokens=24))
        assert gen.completion_ids == fresh_logits(trained, gen).argmax(-1).tolist()
    assert lora.get_base_model().generation_config is before  # put back after the call
    assert before.repetition_penalty == 1.5
