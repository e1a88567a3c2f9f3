"""BatchingPolicy as a wrapper: its settings, its handle, its worker's life and clean exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from flowlearn.engine import batching
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.chat import HFChatModel
from flowlearn.engine.local import FrozenBasePolicy, HFPolicy
from flowlearn.engine.sampling import Sampling

PROMPTS = ["What is 17 * 23?", "Hi"]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.fixture
def policies(tiny_model_dir: Path) -> tuple[HFPolicy, BatchingPolicy]:
    single = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    return single, BatchingPolicy(single, max_batch_size=8, max_wait_s=0.2)


def test_bad_settings_are_errors(policies: tuple[HFPolicy, BatchingPolicy]) -> None:
    single, _ = policies
    with pytest.raises(ValueError, match="max_batch_size"):
        BatchingPolicy(single, max_batch_size=0)
    with pytest.raises(ValueError, match="max_wait_s"):
        BatchingPolicy(single, max_wait_s=-1)


def test_policies_on_one_handle_share_its_lock(policies: tuple[HFPolicy, BatchingPolicy]) -> None:
    single, batched = policies
    other = HFPolicy.on(single.handle, version="other")
    base = FrozenBasePolicy(other)
    assert single.handle is batched.handle is other.handle is base.handle
    assert base.version == "other:base" and other.model is single.model
    assert HFPolicy(single.model, single.tokenizer).handle.lock is not single.handle.lock


def test_the_wrapper_composes_and_serves_as_an_engine(
    policies: tuple[HFPolicy, BatchingPolicy],
) -> None:
    single, batched = policies
    assert not isinstance(batched, HFPolicy) and batched.wrapped is single
    assert batched.version == single.version
    engine = HFChatModel(policy=batched, max_new_tokens=6)
    assert (
        engine.invoke("Hi").content
        == engine.model_copy(update={"policy": single}).invoke("Hi").content
    )
    streamed = "".join(str(chunk.content) for chunk in engine.stream("Hi"))  # alone, not queued
    assert streamed == engine.invoke("Hi").content


def test_an_idle_worker_ends_and_the_next_call_starts_one(
    policies: tuple[HFPolicy, BatchingPolicy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training makes a batching policy per step: idle workers must not pile up."""
    single, batched = policies
    monkeypatch.setattr(batching, "IDLE_EXIT_S", 0.05)
    greedy = Sampling(temperature=0.0, max_new_tokens=4)
    first = batched.generate(chat(PROMPTS[0]), greedy)
    worker = batched._worker
    assert worker is not None
    worker.join(timeout=5)
    assert not worker.is_alive() and batched._worker is None
    again = batched.generate(chat(PROMPTS[0]), greedy)
    assert again.completion_ids == first.completion_ids
    assert again.completion_ids == single.generate(chat(PROMPTS[0]), greedy).completion_ids


def test_close_stops_the_worker_and_the_next_call_starts_one(
    policies: tuple[HFPolicy, BatchingPolicy],
) -> None:
    _single, batched = policies
    greedy = Sampling(temperature=0.0, max_new_tokens=4)
    first = batched.generate(chat(PROMPTS[0]), greedy)
    worker = batched._worker
    assert worker is not None and worker.is_alive()  # idle, waiting up to IDLE_EXIT_S
    batched.close()  # what weakref.finalize runs at interpreter exit
    assert not worker.is_alive()
    assert batched.generate(chat(PROMPTS[0]), greedy).completion_ids == first.completion_ids


EXIT_WITH_AN_IDLE_WORKER = """
import sys
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Sampling
batched = BatchingPolicy(HFPolicy.from_pretrained(sys.argv[1], device="cpu"), max_wait_s=0.0)
batched.generate([{"role": "user", "content": "Hi"}], Sampling(temperature=0.0, max_new_tokens=3))
assert batched._worker is not None and batched._worker.is_alive()
print("exiting")
"""


@pytest.mark.slow
def test_the_interpreter_exits_cleanly_with_an_idle_worker(tiny_model_dir: Path) -> None:
    """A daemon worker waking during finalization would abort the process (exit code 134)."""
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WITH_AN_IDLE_WORKER, str(tiny_model_dir)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exiting" in done.stdout


def test_the_worker_counts_where_its_time_goes(policies: tuple[HFPolicy, BatchingPolicy]) -> None:
    _, batched = policies
    sampling = Sampling(temperature=1.0, max_new_tokens=5, seed=1)
    futures = [
        batched.submit(batched.encode_chat(chat(text)), sampling, ()) for text in PROMPTS * 2
    ]
    generations = [future.result(timeout=60) for future in futures]
    stats = batched.stats
    tokens = sum(len(g.completion_ids) for g in generations)
    assert stats.requests == stats.prefill_rows == 4 and stats.tokens == tokens
    assert stats.steps >= 4 and 4 <= stats.row_steps + 4 <= tokens + 4
    assert 0 < stats.occupancy(8) <= 0.5  # at most 4 of 8 rows were ever busy
    assert stats.prefill_seconds > 0 and stats.forward_seconds > 0 and stats.pick_seconds > 0
    assert stats.queue_seconds >= 0 and stats.idle_seconds >= 0 and stats.forming_seconds > 0
    assert "sync" not in stats.as_dict() and stats.as_dict()["steps"] == stats.steps
    batched.close()
