"""BatchingPolicy: concurrent calls decoded together, each logged as a single call would be."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from flowlearn.engine import kv_cache, tokens
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.draws import generator, pick_rows
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Generation, Sampling

PROMPTS = ["What is 17 * 23?", "Capital of France?", "Tool Name: python", "Hi"]


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def together(policy: BatchingPolicy, calls: list[tuple[str, Sampling]]) -> list[Any]:
    """Start every call at once from its own thread; return results or exceptions."""

    def one(call: tuple[str, Sampling]) -> Any:
        try:
            return policy.generate(chat(call[0]), call[1])
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(one, calls))


@contextmanager
def rows_per_forward(model: torch.nn.Module) -> Iterator[list[int]]:
    """Record the rows of each forward pass of `model`, from a torch forward pre-hook."""
    rows: list[int] = []

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if kwargs.get("input_ids") is not None:
            rows.append(int(kwargs["input_ids"].shape[0]))

    hooked = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield rows
    finally:
        hooked.remove()


def rescored(policy: HFPolicy, generation: Generation, temperature: float) -> list[float]:
    """Logprobs of the completion recomputed by one forward pass over prompt + completion."""
    ids = torch.tensor([generation.prompt_ids + generation.completion_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0].float()
    start = len(generation.prompt_ids)
    steps = logits[start - 1 : start - 1 + len(generation.completion_ids)]
    scaled = torch.log_softmax(steps / (temperature or 1.0), -1)
    return [float(scaled[j, t]) for j, t in enumerate(generation.completion_ids)]


@pytest.fixture
def policies(tiny_model_dir: Path) -> tuple[HFPolicy, BatchingPolicy]:
    single = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    return single, BatchingPolicy(single, max_batch_size=8, max_wait_s=0.2)


def test_greedy_batch_matches_single_calls(policies: tuple[HFPolicy, BatchingPolicy]) -> None:
    single, batched = policies
    greedy = Sampling(temperature=0.0, max_new_tokens=12)
    with rows_per_forward(single.model) as rows:
        results = together(batched, [(p, greedy) for p in PROMPTS])
    assert max(rows) > 1  # they really shared a batch
    for prompt, got in zip(PROMPTS, results, strict=True):
        alone = single.generate(chat(prompt), greedy)
        assert got.prompt_ids == alone.prompt_ids
        assert got.completion_ids == alone.completion_ids
        assert got.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert got.policy_version == alone.policy_version


def test_each_request_keeps_its_own_sampling(policies: tuple[HFPolicy, BatchingPolicy]) -> None:
    single, batched = policies
    calls = [
        (PROMPTS[0], Sampling(temperature=0.0, max_new_tokens=10)),
        (PROMPTS[1], Sampling(temperature=1.0, max_new_tokens=7, seed=1)),
        (PROMPTS[2], Sampling(temperature=0.5, top_p=0.9, max_new_tokens=3, seed=2)),
        (PROMPTS[3], Sampling(temperature=1.3, max_new_tokens=5, seed=3)),
    ]
    results = together(batched, calls)
    for (_, sampling), got in zip(calls, results, strict=True):
        assert 1 <= len(got.completion_ids) <= sampling.max_new_tokens
        assert got.sampling == sampling.as_dict()
        expected = rescored(single, got, sampling.temperature)
        assert got.logprobs == pytest.approx(expected, abs=1e-4)
    # the same seed samples the same tokens, whatever else shares the batch
    again = together(batched, [calls[1], (PROMPTS[0], Sampling(temperature=1.0, seed=9))])
    assert again[0].completion_ids == results[1].completion_ids


def test_unseeded_sampling_follows_the_global_seed(
    policies: tuple[HFPolicy, BatchingPolicy],
) -> None:
    """`transformers.set_seed` (TRL's `args.seed`) makes unseeded batched sampling repeatable."""
    _, batched = policies
    hot = Sampling(temperature=1.5, max_new_tokens=12)

    def sampled(seed: int) -> list[list[int]]:
        torch.manual_seed(seed)
        futures = [batched.submit(batched.encode_chat(chat(p)), hot) for p in PROMPTS]
        return [future.result().completion_ids or [] for future in futures]

    first = sampled(0)
    assert sampled(0) == first
    assert sampled(1) != first
    assert len(set(map(tuple, first))) > 1  # each request drew its own seed


def test_a_failing_request_fails_alone(
    policies: tuple[HFPolicy, BatchingPolicy], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, batched = policies
    real = tokens.generator

    def broken_for_666(seed: int | None, device: Any) -> Any:
        if seed == 666:
            raise RuntimeError("this request's sampler is broken")
        return real(seed, device)

    monkeypatch.setattr(tokens, "generator", broken_for_666)
    fine = Sampling(temperature=0.0, max_new_tokens=4)
    results = together(
        batched,
        [
            (PROMPTS[0], fine),
            (PROMPTS[1], Sampling(max_new_tokens=4, seed=666)),
            (PROMPTS[2], fine),
        ],
    )
    assert isinstance(results[1], RuntimeError) and "broken" in str(results[1])
    assert all(isinstance(r, Generation) for r in (results[0], results[2]))
    too_long = together(batched, [(PROMPTS[0], Sampling(max_new_tokens=100_000))])
    assert isinstance(too_long[0], ValueError) and "lower max_new_tokens" in str(too_long[0])


SHARED = "You are a planner. " * 12 + "Choose one tool from: python, local_search. Question: "


@pytest.mark.parametrize("min_shared_prefix", [8, 10**9])
def test_a_shared_prefix_is_read_once_and_changes_nothing(
    tiny_model_dir: Path, min_shared_prefix: int
) -> None:
    single = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    batched = BatchingPolicy(
        single, max_batch_size=8, max_wait_s=0.2, min_shared_prefix=min_shared_prefix
    )
    prompts = [SHARED + p for p in PROMPTS]
    encoded = [batched.encode_chat(chat(p)) for p in prompts]
    assert tokens.shared_prefix_length(encoded) > 40
    calls = [
        (prompts[0], Sampling(temperature=0.0, max_new_tokens=10)),
        (prompts[1], Sampling(temperature=0.0, max_new_tokens=6)),
        (prompts[2], Sampling(temperature=0.9, max_new_tokens=8, seed=4)),
        (prompts[3], Sampling(temperature=0.0, max_new_tokens=12)),
    ]
    with rows_per_forward(single.model) as rows:
        results = together(batched, calls)
    assert max(rows) > 1
    for (prompt, sampling), got in zip(calls, results, strict=True):
        assert got.prompt_ids == single.encode_chat(chat(prompt))
        assert got.logprobs == pytest.approx(rescored(single, got, sampling.temperature), abs=1e-4)
        if sampling.temperature == 0:
            alone = single.generate(chat(prompt), sampling)
            assert got.completion_ids == alone.completion_ids


def test_shared_prefix_length_leaves_every_prompt_a_token() -> None:
    assert tokens.shared_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert tokens.shared_prefix_length([[1, 2, 3, 4], [1, 2, 9], [1, 2, 3]]) == 2
    assert tokens.shared_prefix_length([[5], [5, 6]]) == 0
    assert tokens.shared_prefix_length([[1, 2], [3, 2]]) == 0


@pytest.mark.parametrize(
    ("sampling", "expected"),
    [
        (Sampling(temperature=1.0), [0.5, 0.3, 0.2]),
        (Sampling(temperature=1.0, top_p=0.6), [0.625, 0.375, 0.0]),  # the tail is cut
        (Sampling(temperature=2.0), [0.4154, 0.3218, 0.2628]),  # probs ** 0.5, normalised
    ],
)
def test_sampling_draws_from_the_logged_distribution(
    sampling: Sampling, expected: list[float]
) -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0]))
    draws = 4000
    generators = [generator(seed, torch.device("cpu")) for seed in range(draws)]
    picked = pick_rows(logits.repeat(draws, 1), [sampling] * draws, generators)
    counts = torch.bincount(torch.tensor([t for t, _ in picked]), minlength=5) / draws
    assert counts[:3].tolist() == pytest.approx(expected, abs=0.03)
    assert counts[3:].sum() == 0  # zero-probability tokens are never drawn
    scaled = torch.log_softmax(logits / sampling.temperature, -1)
    assert all(lp == pytest.approx(float(scaled[t]), abs=1e-6) for t, lp in picked)


def test_prompts_of_two_kinds_are_read_as_two_groups_and_decoded_together(
    tiny_model_dir: Path,
) -> None:
    single = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    batched = BatchingPolicy(single, max_batch_size=8, max_wait_s=0.2, min_shared_prefix=8)
    other = "Judge whether the memory answers the question. " * 8 + "Question: "
    prompts = [SHARED + p for p in PROMPTS[:2]] + [other + p for p in PROMPTS]
    encoded = [batched.encode_chat(chat(p)) for p in prompts]
    groups = tokens.prefix_groups(encoded, 8)
    assert sorted(sorted(g) for g in groups) == [[0, 1], [2, 3, 4, 5]]
    budgets = [10, 3, 12, 6, 9, 4]
    calls = [
        (p, Sampling(temperature=0.0, max_new_tokens=b))
        for p, b in zip(prompts, budgets, strict=True)
    ]
    with rows_per_forward(single.model) as rows:
        results = together(batched, calls)
    assert max(rows) == len(calls)  # one decoding loop for both groups
    for (prompt, sampling), got in zip(calls, results, strict=True):
        alone = single.generate(chat(prompt), sampling)
        assert got.completion_ids == alone.completion_ids
        assert got.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


LONG_CALL = (PROMPTS[3], Sampling(temperature=0.0, max_new_tokens=300))
# longer prompts than the long one: joining its batch left-pads it, leaving lets it be trimmed
SHORT_CALLS = [(SHARED + p, Sampling(temperature=0.0, max_new_tokens=5)) for p in PROMPTS[:2]]


def long_then_short_calls(
    single: HFPolicy, batched: BatchingPolicy
) -> tuple[list[Generation], list[int], dict[str, float]]:
    """Start `LONG_CALL`, and once it decodes the `SHORT_CALLS`; return the results in that
    order, the rows of every forward, and when each call returned."""
    finished: dict[str, float] = {}

    def call(name: str, prompt: str, sampling: Sampling) -> Generation:
        got = batched.generate(chat(prompt), sampling)
        finished[name] = time.perf_counter()
        return got

    with rows_per_forward(single.model) as rows, ThreadPoolExecutor(max_workers=3) as pool:
        running = pool.submit(call, "long", *LONG_CALL)
        while not rows:  # the long request is being decoded
            time.sleep(0.001)
        shorts = [pool.submit(call, f"short{i}", *c) for i, c in enumerate(SHORT_CALLS)]
        results = [running.result(), *(s.result() for s in shorts)]
    return results, rows, finished


def test_requests_join_a_running_batch_and_leave_it_when_done(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trimmed: list[int] = []
    real_trim = kv_cache.trim_left

    def trim(cache: Any, mask: Any) -> Any:
        kept = real_trim(cache, mask)
        trimmed.append(mask.shape[1] - kept[1].shape[1])
        return kept

    monkeypatch.setattr(kv_cache, "trim_left", trim)
    single = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    batched = BatchingPolicy(single, max_batch_size=8, max_wait_s=0.0, min_shared_prefix=8)
    results, rows, finished = long_then_short_calls(single, batched)
    assert max(rows) == 3  # the short ones joined the long one's batch
    assert max(trimmed) > 0  # their padding columns went with them
    assert len(results[0].completion_ids) > 5
    assert max(finished["short0"], finished["short1"]) < finished["long"]  # returned at once
    for (prompt, sampling), got in zip([LONG_CALL, *SHORT_CALLS], results, strict=True):
        alone = single.generate(chat(prompt), sampling)
        assert got.completion_ids == alone.completion_ids
        assert got.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_a_static_batch_makes_later_calls_wait_for_the_running_one(tiny_model_dir: Path) -> None:
    """`continuous=False` (what bench/rollout_speed.py's static arm measures): calls that arrive
    while a batch decodes wait until its every row is done, then decode together, unchanged."""
    single = HFPolicy.from_pretrained(tiny_model_dir, device="cpu")
    batched = BatchingPolicy(single, max_batch_size=8, max_wait_s=0.0, continuous=False)
    results, rows, finished = long_then_short_calls(single, batched)
    long_steps = len(results[0].completion_ids)
    assert long_steps > 5
    assert max(rows[:long_steps]) == 1  # nothing joined the running batch
    assert max(rows) == 2  # the two that waited decoded together afterwards
    assert min(finished["short0"], finished["short1"]) > finished["long"]
    for (prompt, sampling), got in zip([LONG_CALL, *SHORT_CALLS], results, strict=True):
        assert got.completion_ids == single.generate(chat(prompt), sampling).completion_ids


def test_a_seeded_call_samples_the_same_tokens_alone_or_in_a_batch(
    policies: tuple[HFPolicy, BatchingPolicy],
) -> None:
    single, batched = policies
    calls = [
        (PROMPTS[1], Sampling(temperature=1.0, max_new_tokens=7, seed=1)),
        (PROMPTS[2], Sampling(temperature=0.8, top_p=0.9, max_new_tokens=6, seed=2)),
    ]
    together_ = together(batched, calls)
    state = torch.get_rng_state()
    for (prompt, sampling), got in zip(calls, together_, strict=True):
        alone = single.generate(chat(prompt), sampling)
        assert alone.completion_ids == got.completion_ids
        assert alone.logprobs == pytest.approx(got.logprobs, abs=1e-4)
    assert torch.equal(torch.get_rng_state(), state)  # torch's own generator left alone
    other = single.generate(chat(PROMPTS[1]), Sampling(temperature=1.0, max_new_tokens=7, seed=5))
    assert other.completion_ids != together_[0].completion_ids
