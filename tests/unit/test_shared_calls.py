"""Identical greedy calls in flight are decoded once; sampled ones never are."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest
from test_batching import chat, rows_per_forward

from flowlearn.engine.batching import BatchingPolicy, SharedCalls, call_key
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Generation, Sampling
from flowlearn.engine.stops import StopWatch

GREEDY = Sampling(temperature=0.0, max_new_tokens=12)


@pytest.fixture
def policies(tiny_model_dir: Path) -> tuple[HFPolicy, BatchingPolicy]:
    single = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    return single, BatchingPolicy(single, max_batch_size=8, max_wait_s=0.2)


def test_identical_greedy_calls_decode_once_and_each_gets_the_single_call_result(
    policies: tuple[HFPolicy, BatchingPolicy],
) -> None:
    single, batched = policies
    prompt = batched.encode_chat(chat("What is 17 * 23?"))
    with rows_per_forward(single.model) as rows:
        futures = [batched.submit(prompt, GREEDY) for _ in range(4)]
        results = [f.result(timeout=60) for f in futures]
    assert batched.shared_calls.shared == 3
    assert max(rows) == 1  # one row decoded, for four callers
    alone = single.generate(chat("What is 17 * 23?"), GREEDY)
    for got in results:
        assert got.prompt_ids == alone.prompt_ids
        assert got.completion_ids == alone.completion_ids
        assert got.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    results[1].completion_ids.append(-1)  # each caller owns its lists
    assert results[0].completion_ids == alone.completion_ids
    assert len({id(r) for r in results}) == 4


def test_sampled_calls_and_different_budgets_are_never_shared(
    policies: tuple[HFPolicy, BatchingPolicy],
) -> None:
    _, batched = policies
    prompt = batched.encode_chat(chat("Capital of France?"))
    sampled = Sampling(temperature=0.9, max_new_tokens=8, seed=3)
    futures = [batched.submit(prompt, sampled) for _ in range(3)]
    futures.append(batched.submit(prompt, Sampling(temperature=0.0, max_new_tokens=5)))
    futures.append(batched.submit(prompt, Sampling(temperature=0.0, max_new_tokens=6)))
    for f in futures:
        f.result(timeout=60)
    assert batched.shared_calls.shared == 0


def test_a_follower_gets_the_leaders_stop_verdict(
    policies: tuple[HFPolicy, BatchingPolicy],
) -> None:
    single, batched = policies
    prompt = batched.encode_chat(chat("Hi"))
    text = single.generate(chat("Hi"), GREEDY).text
    assert len(text) >= 2, "the tiny model should write something to stop on"
    stop = text[:2]
    decode = single.tokenizer.decode
    watches = [StopWatch(decode, (stop,)) for _ in range(3)]
    futures = [batched.submit(prompt, GREEDY, stopping=w) for w in watches]
    results = [f.result(timeout=60) for f in futures]
    assert batched.shared_calls.shared == 2
    assert {w.reason for w in watches} == {"stop"}
    assert {w.detail for w in watches} == {stop}
    assert len({w.tokens for w in watches}) == 1
    assert len({tuple(r.completion_ids or []) for r in results}) == 1
    other = StopWatch(decode, ("never written",))
    assert call_key(prompt, GREEDY, (), other) != call_key(prompt, GREEDY, (), watches[0])


def test_a_failing_leader_fails_its_followers_and_is_forgotten() -> None:
    calls = SharedCalls()
    started: list[Future[Generation]] = []

    def start() -> Future[Generation]:
        started.append(Future())
        return started[-1]

    key = call_key([1, 2, 3], GREEDY, (), None)
    leader = calls.join(key, None, start)
    follower = calls.join(key, None, start)
    assert len(started) == 1 and calls.shared == 1
    started[0].set_exception(RuntimeError("bad prompt"))
    with pytest.raises(RuntimeError, match="bad prompt"):
        follower.result(timeout=1)
    assert leader.exception() is not None
    calls.join(key, None, start)  # a later identical call decodes anew
    assert len(started) == 2
    assert call_key([1, 2, 3], Sampling(temperature=0.5), (), None) is None
