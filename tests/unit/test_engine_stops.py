"""The engine's early stops: stop strings and degenerate repetition, on scripted ids and a model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flowlearn.engine.stops import (
    IncrementalText,
    RepetitionRule,
    StopWatch,
    cut_at_stop,
    held_back,
)
from flowlearn.nodes.tools import BUNDLED_CORPUS

PROSE = """\
Nairobi is the capital and largest city of Kenya. The city lies in the south of the country,
at an altitude of about 1,795 metres, and had a population of 4.4 million at the 2019 census.
The name comes from the Maasai phrase meaning "place of cool waters", a reference to the
Nairobi River which flows through the city. It was founded in 1899 by the colonial
authorities in British East Africa as a rail depot on the Uganda Railway.
To compute 17 * 23, multiply 17 by 20 to get 340, then 17 by 3 to get 51, and add: 391.
Conclusion: STOP
1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25
| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n| 5 | 6 |
x = 0\ny = 0\nz = 0\nprint(x, y, z)\nha ha ha ha, said the man. No, no, no!
"""

LOOP = "The answer is presented in the requested format. "


def char_ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def fires(rule: RepetitionRule, ids: list[int]) -> int | None:
    """Feed `ids` one at a time, as decoding does; return the length at which the rule fires."""
    return next((n for n in range(1, len(ids) + 1) if rule.period(ids[:n]) is not None), None)


def test_a_looping_sentence_stops_at_its_fourth_copy() -> None:
    head = "Kenya's capital is Nairobi. "
    ids = char_ids(head + LOOP * 10)
    rule = RepetitionRule(max_period=60)
    stop = fires(rule, ids)
    assert stop is not None and rule.period(ids[:stop]) == len(LOOP)
    # The 4th copy ends the call; the block may start a little early, as ". " ends both.
    assert len(head) + 3 * len(LOOP) < stop <= len(head) + 4 * len(LOOP)


def test_short_periods_need_a_long_span() -> None:
    rule = RepetitionRule()
    assert fires(rule, [5] * 47) is None and fires(rule, [5] * 48) == 48
    assert fires(rule, [1, 2] * 23) is None and fires(rule, [9] + [1, 2] * 30) == 49


def test_normal_text_never_stops() -> None:
    rule = RepetitionRule()
    corpus = [json.loads(line)["text"] for line in BUNDLED_CORPUS.read_text().splitlines()]
    for text in (PROSE, "\n".join(corpus)):  # the corpus: one template, different names
        assert fires(rule, char_ids(text)) is None


def test_normal_text_never_stops_in_real_tokens(tiny_model_dir: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)
    rule = RepetitionRule()
    assert fires(rule, tokenizer.encode(PROSE)) is None
    assert fires(rule, tokenizer.encode(LOOP * 8)) is not None


def test_bad_rules_are_errors() -> None:
    with pytest.raises(ValueError):
        RepetitionRule(min_repeats=1)
    with pytest.raises(ValueError):
        RepetitionRule(max_period=0)


def scripted(pieces: list[str]) -> tuple[StopWatch, list[int]]:
    """A watch over a byte-per-piece vocabulary: token i decodes to pieces[i]."""

    def decode(ids: list[int]) -> str:
        return "".join(pieces[i] for i in ids)

    return StopWatch(decode, ("</answer>",)), list(range(len(pieces)))


def test_a_stop_string_split_across_tokens_fires_at_the_token_that_completes_it() -> None:
    watch, ids = scripted(["So ", "<answer>", "Nai", "robi</", "ans", "wer>", " more"])
    ended = next(n for n in range(1, len(ids) + 1) if watch.update(ids[:n]))
    assert ended == 6 and watch.tokens == 6 and watch.reason == "stop"
    assert watch.detail == "</answer>" and "'</answer>'" in (watch.note() or "")
    assert watch.cut("So <answer>Nairobi</answer> more") == "So <answer>Nairobi"


def test_a_forced_tool_call_ends_when_its_json_closes() -> None:
    pieces = ["17 * ", '23"', "}", "}", " and then more text"]
    watch = StopWatch(lambda ids: "".join(pieces[i] for i in ids), json_prefix='{"a": {"c": "')
    ended = next(n for n in range(1, len(pieces) + 1) if watch.update(list(range(n))))
    assert ended == 4 and watch.reason == "stop" and "JSON object closed" in (watch.note() or "")
    assert not StopWatch(lambda ids: '"}}', json_prefix="no json ").update([0])


def test_the_watch_reports_a_repetition() -> None:
    watch = StopWatch(lambda ids: "", repetition=RepetitionRule(min_span=8, min_repeats=4))
    assert not watch.update([1, 2, 3] + [1, 2] * 3 + [1])
    assert watch.update([1, 2, 3] + [1, 2] * 4)
    assert watch.reason == "repetition" and "2-token block repeated 4 times" in watch.detail


MULTI_BYTE = "Zürich, 東京 and São Paulo: ☕ costs 3 €. Ça va? — oui.\n"


def metaspace_tokenizer() -> Any:
    """A SentencePiece-style tokenizer as Llama's: a window's leading space is stripped."""
    from tokenizers import Tokenizer, decoders, models, normalizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "</s>"])
    tokenizer.train_from_iterator([PROSE] * 3, trainer)
    spec = json.loads(tokenizer.to_str())  # the bytes that characters unseen fall back to
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    return Tokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize("kind", ["byte-level BPE", "metaspace with byte fallback"])
def test_incremental_text_spells_what_the_whole_decode_does(
    kind: str, tiny_model_dir: Path
) -> None:
    """At every length the text equals the whole decode, but for a half-written character."""
    from transformers import PreTrainedTokenizerFast

    if kind == "byte-level BPE":
        tokenizer = PreTrainedTokenizerFast.from_pretrained(tiny_model_dir)
        ids = tokenizer.encode(PROSE + MULTI_BYTE + "</s> end", add_special_tokens=False)

        def decode(got: list[int]) -> str:
            return str(tokenizer.decode(got, skip_special_tokens=True))
    else:
        raw = metaspace_tokenizer()
        ids = [*raw.encode(PROSE + MULTI_BYTE).ids, raw.token_to_id("</s>")]
        ids += raw.encode(" end").ids

        def decode(got: list[int]) -> str:
            return str(raw.decode(got, skip_special_tokens=True))

    text, final = IncrementalText(decode), decode(ids)
    held = 0
    for n in range(1, len(ids) + 1):
        whole, grown = decode(ids[:n]), text.update(ids[:n])
        if whole.endswith("\ufffd"):  # a character's bytes so far: it waits for the rest
            held += 1
            assert final.startswith(grown)
        else:
            assert grown == whole, n
    assert held > 0 and grown.endswith(" end")
    assert text.update(ids[:5]) == decode(ids[:5])  # not an extension: decoded afresh


def test_cut_and_hold_back() -> None:
    assert cut_at_stop("a STOP b END c", ["END", "STOP"]) == "a "
    assert cut_at_stop("abc", None) == "abc"
    assert held_back("text </ans", ["</answer>"]) == 5
    assert held_back("text", ["</answer>"]) == 0
    assert held_back("ab", ["b>", "ab!"]) == 2


# --- on a real (tiny) model: every path stops where the text says, with faithful logprobs ---

MESSAGE = "What is 17 * 23?"


@pytest.fixture(scope="module")
def models(tiny_model_dir: Path) -> Iterator[tuple[Any, Any]]:
    from flowlearn.engine.batching import BatchingPolicy
    from flowlearn.engine.local import HFPolicy

    single = HFPolicy.from_pretrained(str(tiny_model_dir), device="cpu")
    batched = BatchingPolicy(single, max_batch_size=4)
    yield single, batched
    batched.close()


def sampled(policy: Any, stop: list[str] | None = None, how: str = "call") -> Any:
    """Sample one reply at temperature 1 from a fixed seed (the same draws every time).

    `how` passes the stop strings as the call's argument, by `.bind(stop=...)`, or as the
    model's `stop` field.
    """
    import torch

    from flowlearn.engine.chat import HFChatModel

    engine = HFChatModel(policy=policy, temperature=1.0, max_new_tokens=24, repetition=None)
    torch.manual_seed(0)
    if how == "bound":
        return engine.bind(stop=stop).invoke(MESSAGE)
    if how == "field":
        return engine.model_copy(update={"stop": stop}).invoke(MESSAGE)
    return engine.invoke(MESSAGE, stop=stop)


def a_stop_string(decode: Any, ids: list[int]) -> tuple[str, int]:
    """Pick 2 printable characters of the text after token 4; return them and the stop length."""
    text = decode(ids)
    for start in range(len(decode(ids[:4])), len(text) - 2):
        candidate = text[start : start + 2]
        if candidate.isascii() and candidate.isprintable() and text.find(candidate) == start:
            ended = next(n for n in range(1, len(ids) + 1) if candidate in decode(ids[:n]))
            if ended < len(ids):
                return candidate, ended
    raise AssertionError(f"no usable stop string in {text!r}")


@pytest.mark.parametrize("path", ["single", "batched", "bound", "field"])
def test_stop_strings_end_the_call_with_faithful_ids(path: str, models: tuple[Any, Any]) -> None:
    single, batched = models
    policy = batched if path == "batched" else single
    free = sampled(policy)
    ids, logprobs = free.response_metadata["completion_ids"], free.response_metadata["logprobs"]

    def decode(part: list[int]) -> str:
        return str(single.tokenizer.decode(part, skip_special_tokens=True))

    stop, ended = a_stop_string(decode, ids)
    reply = sampled(policy, [stop], path if path in ("bound", "field") else "call")
    meta = reply.response_metadata
    assert reply.content == free.content[: free.content.find(stop)]
    assert meta["completion_ids"] == ids[:ended]  # the token that completes the stop is the last
    assert meta["logprobs"] == pytest.approx(logprobs[:ended], abs=1e-5)
    assert meta["finish_reason"] == "stop" and meta["stop_sequence"] == stop
    assert free.response_metadata["finish_reason"] == "length"


def test_a_stream_never_shows_the_stop_string(models: tuple[Any, Any]) -> None:
    import torch

    from flowlearn.engine.chat import HFChatModel

    single, _ = models
    free = sampled(single)

    def decode(part: list[int]) -> str:
        return str(single.tokenizer.decode(part, skip_special_tokens=True))

    stop, _ = a_stop_string(decode, free.response_metadata["completion_ids"])
    engine = HFChatModel(policy=single, temperature=1.0, max_new_tokens=24, repetition=None)
    torch.manual_seed(0)
    chunks = list(engine.stream(MESSAGE, stop=[stop]))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.content == free.content[: free.content.find(stop)]
    assert merged.response_metadata == {
        "finish_reason": "stop",
        "stop_sequence": stop,
        "notes": [f"engine stopped at the stop string {stop!r}"],
    }


@pytest.mark.parametrize("path", ["single", "batched"])
def test_a_degenerate_repetition_ends_a_greedy_call(path: str, models: tuple[Any, Any]) -> None:
    from flowlearn.engine.chat import HFChatModel

    single, batched = models
    policy = batched if path == "batched" else single
    free = HFChatModel(policy=policy, max_new_tokens=80, repetition=None).invoke(MESSAGE)
    reply = HFChatModel(policy=policy, max_new_tokens=80).invoke(MESSAGE)  # the rule is on
    ids = free.response_metadata["completion_ids"]
    kept = reply.response_metadata["completion_ids"]
    assert RepetitionRule().period(ids) is not None  # the tiny model loops under greedy
    assert len(kept) < len(ids) and kept == ids[: len(kept)]
    assert reply.response_metadata["logprobs"] == pytest.approx(
        free.response_metadata["logprobs"][: len(kept)], abs=1e-5
    )
    assert reply.response_metadata["finish_reason"] == "repetition"
    assert "degenerate repetition" in reply.response_metadata["notes"][0]


def test_budgets_bound_per_call_and_the_fixed_override(models: tuple[Any, Any]) -> None:
    from flowlearn.engine.chat import HFChatModel

    single, _ = models
    engine = HFChatModel(policy=single, max_new_tokens=9, repetition=None)
    assert len(engine.invoke(MESSAGE).response_metadata["completion_ids"]) == 9
    bound = engine.bind(max_tokens=5).invoke(MESSAGE)
    assert len(bound.response_metadata["completion_ids"]) == 5
    assert bound.response_metadata["notes"] == ["engine budget spent: 5 tokens"]
    assert engine.budget({"max_new_tokens": 7}) == 7
    fixed = engine.model_copy(update={"fixed_max_new_tokens": 3})
    assert len(fixed.bind(max_tokens=5).invoke(MESSAGE).response_metadata["completion_ids"]) == 3
