"""Rollouts in flight: by default every rollout of a step, decoded in one batch as TRL's is."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from provenance_setup import turn

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.local import HFPolicy
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.training.rollouts import Rollouts, step_concurrency


class PeakGraph:
    """A graph of one planner call that holds its thread a moment and counts runs in flight."""

    def __init__(self) -> None:
        self.lock, self.now, self.peak = threading.Lock(), 0, 0

    def invoke(self, inputs: dict[str, Any], context: Any = None) -> dict[str, Any]:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        time.sleep(0.2)
        with self.lock:
            self.now -= 1
        call = turn("set when stored", 1, temperature=0.7)
        return {"question": inputs["question"], "answer": "x", "transitions": [call]}


CASES = [Case(str(i), f"Q{i}?", "x") for i in range(3)]


def score(answer: str, case: Case) -> Score:
    return Score(1.0, "always")


@pytest.mark.slow
@pytest.mark.parametrize(("concurrency", "batch", "peak"), [(None, 12, 12), (5, 5, 5), (1, 0, 1)])
def test_the_steps_rollouts_are_in_flight_and_batched_together_by_default(
    tiny_model_dir: Path, concurrency: int | None, batch: int, peak: int
) -> None:
    graph, given = PeakGraph(), []

    def factory(policy: Any) -> PeakGraph:
        given.append(policy.base.target)  # the step's policy, swapped into the graph's reference
        return graph

    source = Rollouts(factory, score, CASES, concurrency=concurrency)
    policy = HFPolicy.from_pretrained(str(tiny_model_dir))
    out = source.run(policy, CASES, group_size=4, context=None, step=0, rank=0)  # type: ignore[arg-type]
    assert len(out) == 12 and graph.peak == peak
    if batch:  # the planner's calls of the step decode together, up to `batch` at once
        assert isinstance(given[0], BatchingPolicy) and given[0].max_batch_size == batch
    else:  # one at a time: the plain policy, no batching worker
        assert given[0] is policy


def test_a_set_concurrency_wins_and_a_nonpositive_one_is_refused() -> None:
    assert step_concurrency(None, 4, 8) == 32 and step_concurrency(7, 4, 8) == 7
    with pytest.raises(ValueError, match="rollout_concurrency must be >= 1, got 0"):
        Rollouts(lambda policy: None, score, CASES, concurrency=0)


def test_the_training_config_takes_rollout_concurrency_and_bounds_it(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.training.config import FlowGRPOConfig

    def config(**overrides: Any) -> Any:
        values = dict(benchmark="gameof24", output_dir=str(tmp_path), report_to="none")
        return FlowGRPOConfig(**{**values, **overrides})

    assert config().rollout_concurrency is None  # the step's rollouts, Q x G
    assert config(rollout_concurrency=64).rollout_concurrency == 64
    with pytest.raises(ValueError, match=r"rollout_concurrency must be in \[1, 100000\]"):
        config(rollout_concurrency=0)
