"""TransposedLinears: the same products from transposed weight copies, only when inference."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from flowlearn.nodes.batching import BatchingPolicy
from flowlearn.nodes.cpu_linear import TransposedLinears
from flowlearn.nodes.hf_policy import HFPolicy
from flowlearn.nodes.schema.sampling import Sampling


def linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m) is torch.nn.Linear]


@pytest.mark.parametrize("shape", [(3, 9), (2, 40)], ids=["copies", "over-MAX_ROWS"])
def test_logits_match_the_plain_forward_and_the_swap_is_undone(
    tiny_model_dir: Path, shape: tuple[int, int]
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.randint(0, 100, shape)
    fast = TransposedLinears()
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with fast.active(model):
            assert all("forward" in m.__dict__ for m in linears(model))
            swapped = model(input_ids=ids).logits
    assert not any("forward" in m.__dict__ for m in linears(model))
    torch.testing.assert_close(swapped, plain, rtol=1e-5, atol=1e-5)


def test_a_changed_weight_is_copied_again(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = torch.randint(0, 100, (2, 5))
    fast = TransposedLinears()
    with torch.no_grad():
        with fast.active(model):
            model(input_ids=ids)
        for module in linears(model):  # what an optimizer step does: in place
            module.weight.mul_(1.5)
        plain = model(input_ids=ids).logits
        with fast.active(model):
            swapped = model(input_ids=ids).logits
    torch.testing.assert_close(swapped, plain, rtol=1e-5, atol=1e-5)


def test_with_gradients_on_nothing_is_swapped(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with TransposedLinears().active(model):
        assert not any("forward" in m.__dict__ for m in linears(model))
        model(input_ids=torch.randint(0, 100, (1, 4))).logits.sum().backward()
    assert all(m.weight.grad is not None for m in linears(model))


def test_an_instance_forward_is_left_alone(tiny_model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    hooked = linears(model)[0]
    own = hooked.forward
    hooked.forward = own  # as accelerate's offloading hooks set it
    with torch.no_grad(), TransposedLinears().active(model):
        assert hooked.__dict__["forward"] is own
    assert hooked.__dict__["forward"] is own


@pytest.mark.parametrize("enabled", [True, False])
def test_the_batching_option_changes_speed_not_results(tiny_model_dir: Path, enabled: bool) -> None:
    single = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    batched = BatchingPolicy(single, transposed_cpu_weights=enabled)
    greedy = Sampling(temperature=0.0, max_new_tokens=6)
    chat = [{"role": "user", "content": "Hi"}]
    got = batched.generate(chat, greedy)
    # the worker, idle for under IDLE_EXIT_S, still holds the copies it decoded with
    assert bool(batched._linears and batched._linears._copies) is enabled
    alone = single.generate(chat, greedy)
    assert got.completion_ids == alone.completion_ids
    assert got.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_copies_live_only_while_a_batch_is_decoded(tiny_model_dir: Path) -> None:
    """A weight changed through `.data` between two batches is not served from a stale copy."""
    single = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    batched = BatchingPolicy(single)
    greedy = Sampling(temperature=0.0, max_new_tokens=4)
    prompt = batched.encode_chat([{"role": "user", "content": "Hi"}])
    batched.decode([prompt], [greedy])
    assert batched._linears is not None and not batched._linears._copies
    with torch.no_grad():
        for module in linears(single.model):  # what PEFT's merge does: invisible to _version
            module.weight.data += 0.5 * torch.randn_like(module.weight)
    ((ids, logprobs),) = batched.decode([prompt], [greedy])
    alone = single.generate([{"role": "user", "content": "Hi"}], greedy)
    assert ids == alone.completion_ids
    assert logprobs == pytest.approx(alone.logprobs, abs=1e-4)
