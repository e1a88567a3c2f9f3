"""A local engine's forced choice (`choice`): the likeliest reply by its scores, and the verifier's
follow-up made of it."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from pydantic import Field

from fakes import FakeChatModel
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.chat import HFChatModel, ServerChatModel
from flowlearn.engine.local import FrozenBasePolicy, HFPolicy, chat_prompt_ids, choice_logprobs
from flowlearn.engine.server import ServerPolicy
from flowlearn.graphs import Context
from flowlearn.nodes import make_verifier as _make_verifier
from flowlearn.nodes.engine_calls import role_call
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS, VERDICT_CHOICES

make_verifier = partial(_make_verifier, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


CHAT = [{"role": "user", "content": "Is 2 + 2 = 4?"}, {"role": "assistant", "content": "So:"}]


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> Iterator[HFPolicy]:
    yield HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu")


def by_hand(policy: HFPolicy, choice: str, *, prefill: bool = True) -> float:
    """log p(choice | CHAT): the model read on the whole sequence, its choice's tokens summed.

    Without the prefill, the choice is the whole of a new reply to the user's message.
    """
    import torch

    chat = CHAT if prefill else CHAT[:1]
    base = chat_prompt_ids(policy.tokenizer, chat)
    said = "So:" + choice if prefill else choice
    full = chat_prompt_ids(policy.tokenizer, [CHAT[0], {**CHAT[1], "content": said}])
    pairs = zip(base, full, strict=False)  # full is longer
    start = next((i for i, (a, b) in enumerate(pairs) if a != b), len(base))
    with torch.no_grad():
        logits = policy.model(torch.tensor([full])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return float(sum(lp[i - 1, full[i]] for i in range(start, len(full))))


def test_the_reply_is_the_likeliest_choice_scored_as_one_sequence(policy: HFPolicy) -> None:
    choices = [" STOP", " CONTINUE", " maybe so"]  # different lengths: padded in one batch
    scores = choice_logprobs(policy, CHAT, choices)
    assert scores == pytest.approx([by_hand(policy, c) for c in choices], abs=1e-4)
    reply = HFChatModel(policy=policy).bind(choice=choices).invoke(CHAT)
    best = choices[scores.index(max(scores))]
    assert isinstance(reply, AIMessage) and reply.text == best
    meta = reply.response_metadata
    assert meta["choice_logprobs"] == pytest.approx(dict(zip(choices, scores, strict=True)))
    assert meta["finish_reason"] == "stop" and meta["notes"][0].startswith(f"engine chose {best!r}")
    streamed = "".join(c.text for c in HFChatModel(policy=policy).stream(CHAT, choice=choices))
    assert streamed == best
    batched = BatchingPolicy(policy, max_batch_size=2)  # scored on the wrapped model, same values
    assert choice_logprobs(batched, CHAT, choices) == pytest.approx(scores, abs=1e-4)
    batched.close()
    new_reply = choice_logprobs(policy, CHAT[:1], ["Yes", "No"])  # no prefill: a new reply
    assert new_reply == pytest.approx(
        [by_hand(policy, c, prefill=False) for c in ["Yes", "No"]], abs=1e-4
    )


@pytest.mark.parametrize("bad", ["STOP", [], ["STOP"], ["STOP", "STOP"], ["STOP", " "], ["A", 3]])
def test_a_bad_choice_is_a_named_error(policy: HFPolicy, bad: Any) -> None:
    with pytest.raises(ValueError, match="at least two distinct strings that are not blank"):
        HFChatModel(policy=policy).invoke(CHAT, choice=bad)


def test_contradictory_settings_are_errors(policy: HFPolicy) -> None:
    engine = HFChatModel(policy=policy).bind_tools([add], tool_choice="add")
    with pytest.raises(ValueError, match="both `choice` and tools"):
        engine.invoke(CHAT, choice=["Yes", "No"])
    for settings in (
        {"max_tokens": 8, "choice": ["a", "b"]},
        {"stop": ["x"], "choice": ["a", "b"]},
        {},
    ):
        with pytest.raises(ValueError, match=r"written .* or chosen"):
            role_call(HFChatModel(policy=policy), None, **settings)


def test_a_temperature_samples_among_the_choices(policy: HFPolicy) -> None:
    import torch

    choices = [" STOP", " CONTINUE"]
    first, second = choice_logprobs(policy, CHAT, choices)
    hot = 2 * abs(first - second) + 1.0  # at this temperature each has p > 0.3
    engine = HFChatModel(policy=policy, temperature=hot)
    torch.manual_seed(0)
    drawn = [engine.invoke(CHAT, choice=choices).text for _ in range(40)]
    assert set(drawn) == set(choices)
    greedy = HFChatModel(policy=policy).invoke(CHAT, choice=choices)
    assert greedy.text == choices[0 if first > second else 1]
    assert "the likeliest" in greedy.response_metadata["notes"][0]
    note = HFChatModel(policy=policy).invoke(CHAT, choice=choices, temperature=0.5)
    assert "sampled at temperature 0.5" in note.response_metadata["notes"][0]


def test_a_base_policy_scores_with_its_adapter_off(tiny_model_dir: Path, policy: HFPolicy) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lora = LoraConfig(r=2, target_modules="all-linear", init_lora_weights=False)
    trained = HFPolicy(get_peft_model(model, lora), policy.tokenizer)
    choices = [" STOP", " CONTINUE"]
    base_scores = choice_logprobs(policy, CHAT, choices)
    batched = BatchingPolicy(FrozenBasePolicy(trained), max_batch_size=2)
    assert choice_logprobs(batched, CHAT, choices) == pytest.approx(base_scores, abs=1e-4)
    batched.close()
    assert choice_logprobs(trained, CHAT, choices) != pytest.approx(base_scores, abs=1e-3)


class Recording(FakeChatModel):
    """A scripted chat model (no scores) that records each call's settings."""

    settings: list[dict[str, Any]] = Field(default_factory=list)

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        self.settings.append({"stop": stop, **kw})
        return super()._generate(messages, stop, run_manager, **kw)


def test_a_served_engine_refuses_a_choice_and_other_engines_write_the_follow_up(
    policy: HFPolicy,
) -> None:
    assert HFChatModel.scores_choices and not ServerChatModel.scores_choices
    served = ServerChatModel(
        policy=ServerPolicy("http://127.0.0.1:9", "m", tokenizer=policy.tokenizer)
    )
    with pytest.raises(ValueError, match="cannot score a `choice`"):
        served.invoke(CHAT, choice=list(VERDICT_CHOICES))
    replies = iter(["It looks answered.", " STOP"])
    engine = Recording(respond=lambda messages, tools: AIMessage(next(replies)))
    state = {"question": "What is 2 + 2?", "memory": [], "turn": 1, "started_at": 0.0}
    update = make_verifier(engine, retry=None)(state, SimpleNamespace(context=Context()))
    assert update["verdict"] == "STOP" and len(update["transitions"]) == 2
    assert all("choice" not in called for called in engine.settings)
    assert engine.settings[1]["stop"] == ["\n"]


def test_the_verifier_follow_up_of_a_local_engine_is_a_choice(policy: HFPolicy) -> None:
    state = {"question": "What is 2 + 2?", "memory": [], "turn": 1, "started_at": 0.0}
    runtime = SimpleNamespace(context=Context())
    engine = HFChatModel(policy=policy, max_new_tokens=12)  # random weights: no Conclusion line
    update = make_verifier(engine, retry=None)(state, runtime)
    first, second = update["transitions"]
    assert first["parse_status"] == "unclear"
    chosen = second["output"].rsplit("Conclusion:", 1)[1]
    assert chosen in VERDICT_CHOICES and second["parse_status"] == "ok"
    assert update["verdict"] == chosen.strip()
    assert second["notes"][0].startswith(f"engine chose {chosen!r}, the likeliest by its")
