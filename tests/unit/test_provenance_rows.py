"""Provenance of rows: step credit is keyed by position; cut and dropped rows are counted."""

from __future__ import annotations

import math

import pytest
from provenance_setup import rollout, turn

from flowlearn.training import StepCredit, build_flow_grpo_rows
from flowlearn.training.trajectories import DROPPED

EPS = 1e-6


def test_step_credit_is_keyed_by_position_when_two_nodes_share_a_turn() -> None:
    # t0 and t2 make two token-carrying calls in turn 1 (the planner, then a trained
    # verifier), t1 only the planner's: by position t0's planner call is step 1 of 2, so its
    # return is discounted once, though it shares turn 1 with the verifier's (step 2 of 2).
    data = []
    for i, reward in enumerate([1.0, 1.0, 0.0]):
        calls = [turn(f"t{i}", 1, length=2), turn(f"t{i}", 1, node="verifier", length=4)]
        calls[0]["prompt_ids"] = [1, 2, 3]  # every planner call saw the same input
        calls[1]["prompt_ids"] = [5, 5]  # and so did every verifier call
        data.append(rollout(f"t{i}", reward, calls if i != 1 else calls[:1]))
    plain = build_flow_grpo_rows(data, nodes=None)
    credited = build_flow_grpo_rows(data, nodes=None, step_credit=StepCredit(1.0, 0.5))
    assert [(r.trajectory_id, r.node, r.position) for r in credited.rows] == [
        ("t0", "planner", 0),
        ("t0", "verifier", 1),
        ("t1", "planner", 0),
        ("t2", "planner", 0),
        ("t2", "verifier", 1),
    ]
    assert credited.stats["step_groups"] == 2
    # gamma^(T_i - t) * R_i: planner calls [0.5 * 1, 1 * 1, 0.5 * 0], verifier calls [1, 0]
    for node, values in (("planner", [0.5, 1.0, 0.0]), ("verifier", [1.0, 0.0])):
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        pairs = [(r, p) for r, p in zip(credited.rows, plain.rows, strict=True) if r.node == node]
        for (row, base), value in zip(pairs, values, strict=True):
            assert row.advantage == pytest.approx(base.advantage + (value - mean) / (std + EPS))


def test_cut_and_dropped_rows_are_counted() -> None:
    from flowlearn.training.trainer import flow_metrics

    long_prompt = turn("b", 1, length=6)
    long_prompt["prompt_ids"] = list(range(50))
    no_ids = turn("c", 2)
    no_ids["completion_ids"] = no_ids["logprobs"] = None  # the server returned no ids
    errored = rollout("e", 0.0, [turn("e", 1)])
    errored.reward_error = "TimeoutError: judge"
    errored.metadata[DROPPED] = "reward error: TimeoutError: judge"
    flat = [rollout(f"f{i}", 1.0, [turn(f"f{i}", 1)]) for i in range(2)]
    for t in flat:
        t.group_id = "flat"
    data = [
        rollout("a", 1.0, [turn("a", 1, length=9)]),  # cut to 4
        rollout("b", 0.0, [long_prompt]),  # dropped: prompt too long, no row left
        rollout("c", 0.5, [turn("c", 1), no_ids]),  # one policy call without ids
        errored,
        *flat,  # a zero-variance group, dropped
    ]
    batch = build_flow_grpo_rows(
        data,
        nodes=None,
        max_completion_length=4,
        max_prompt_length=10,
        drop_zero_variance=True,
    )
    stats = batch.stats
    assert (stats["rows_cut"], stats["rows_dropped"], stats["trajectories_dropped"]) == (1, 4, 4)
    assert stats["rows"] == 2
    values, group_rewards = flow_metrics(data, stats, 1.0)
    assert values["flow/rows_cut"] == 1.0 and values["flow/rows_dropped"] == 4.0
    assert values["flow/trajectories_dropped"] == 4.0 and values["flow/reward_errors"] == 1.0
    assert group_rewards == {"g": 0.5, "flat": 1.0}  # the dropped reward error is not in it


def test_group_size_counts_only_trajectories_with_rows() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0]
    data = [rollout(f"t{i}", r, [turn(f"t{i}", 1, length=i + 1)]) for i, r in enumerate(rewards)]
    data[1].transitions[0]["prompt_ids"] = list(range(50))  # its only row is dropped
    batch = build_flow_grpo_rows(data, "paper", max_prompt_length=10)
    assert {r.trajectory_id for r in batch.rows} == {"t0", "t2", "t3"}
    for row in batch.rows:  # G = 3: the dropped trajectory does not dilute the others
        assert row.token_weight == pytest.approx(1 / (3 * len(row.completion_ids)))
    assert sum(r.token_weight * len(r.completion_ids) for r in batch.rows) == pytest.approx(1)
    # ... but its reward of 0 stays in the baseline: mean 0.5 over the four, std 0.5
    advantages = {r.trajectory_id: r.advantage for r in batch.rows}
    assert advantages["t2"] == pytest.approx(-0.5 / (0.5 + EPS))
    assert advantages["t0"] == pytest.approx(0.5 / (0.5 + EPS))
    assert batch.stats["trajectories_dropped"] == 1
