from __future__ import annotations

import math
import random

import pytest

from flowlearn.training import Trajectory, Transition, build_flow_grpo_rows

EPS = 1e-6


def turn(tid: str, gid: str, t: int, length: int, node: str = "planner") -> Transition:
    return Transition(
        trajectory_id=tid,
        group_id=gid,
        node=node,
        turn=t,
        messages=[],
        output="",
        parse_status="ok",
        seconds=0.0,
        prompt_ids=[1, 2, 3],
        completion_ids=list(range(length)),
        logprobs=[-0.1] * length,
    )


def trajectory(tid: str, gid: str, reward: float, lengths: list[int]) -> Trajectory:
    transitions = [turn(tid, gid, t + 1, n) for t, n in enumerate(lengths)]
    transitions.append(turn(tid, gid, len(lengths), 5, node="generator"))
    return Trajectory(
        trajectory_id=tid,
        group_id=gid,
        question="q",
        reference="r",
        answer="a",
        final_text="a",
        reward=reward,
        transitions=transitions,
    )


def hand_group() -> list[Trajectory]:
    # rewards [1, 0, 0, 1]; turns [1, 3, 2, 2]; turn lengths chosen to differ
    return [
        trajectory("t0", "g", 1.0, [4]),
        trajectory("t1", "g", 0.0, [2, 3, 5]),
        trajectory("t2", "g", 0.0, [6, 2]),
        trajectory("t3", "g", 1.0, [1, 7]),
    ]


def by_traj(rows):  # type: ignore[no-untyped-def]
    out: dict[str, list] = {}
    for row in rows:
        out.setdefault(row.trajectory_id, []).append(row)
    return out


def test_paper_mode_hand_computed() -> None:
    batch = build_flow_grpo_rows(hand_group(), "paper")
    a = 0.5 / (0.5 + EPS)  # mean 0.5, population std 0.5
    rows = by_traj(batch.rows)
    assert [len(rows[t]) for t in ("t0", "t1", "t2", "t3")] == [1, 3, 2, 2]  # planner only
    for tid, sign, turns in (("t0", 1, 1), ("t1", -1, 3), ("t2", -1, 2), ("t3", 1, 2)):
        for row in rows[tid]:
            assert row.advantage == pytest.approx(sign * a, abs=1e-12)
            assert row.token_weight == pytest.approx(1 / (4 * turns * len(row.completion_ids)))
    # every trajectory weighs 1/G in total, whatever its number of turns
    for tid in rows:
        total = sum(r.token_weight * len(r.completion_ids) for r in rows[tid])
        assert total == pytest.approx(0.25)
    assert batch.stats["rows"] == 8 and batch.stats["tokens"] == 30
    assert batch.stats["mean_turns"] == 2.0 and batch.stats["mean_reward"] == 0.5


def test_verl_like_mode_hand_computed() -> None:
    batch = build_flow_grpo_rows(hand_group(), "verl_like")
    pooled = [1, 0, 0, 0, 0, 0, 1, 1]  # turns [1, 3, 2, 2], each turn-sample carries its R
    mean = sum(pooled) / 8
    std = math.sqrt(sum((r - mean) ** 2 for r in pooled) / 7)  # unbiased, as verl's torch.std
    rows = by_traj(batch.rows)
    assert rows["t0"][0].advantage == pytest.approx((1 - mean) / (std + EPS))
    assert rows["t1"][0].advantage == pytest.approx((0 - mean) / (std + EPS))
    assert all(r.token_weight == pytest.approx(1 / 30) for r in batch.rows)  # token mean


def test_sequence_mode_hand_computed() -> None:
    batch = build_flow_grpo_rows(hand_group(), "sequence")
    for row in batch.rows:
        assert row.token_weight == pytest.approx(1 / (8 * len(row.completion_ids)))
        assert abs(row.advantage) == pytest.approx(0.5 / (0.5 + EPS))


def test_scales() -> None:
    other = [trajectory("u0", "h", 1.0, [2]), trajectory("u1", "h", 0.0, [2])]
    none = build_flow_grpo_rows(hand_group() + other, "paper", scale="none")
    assert {round(r.advantage, 9) for r in none.rows} == {0.5, -0.5}
    batch = build_flow_grpo_rows(hand_group() + other, "paper", scale="batch")
    assert {round(r.advantage, 6) for r in batch.rows} == {
        round(0.5 / (0.5 + EPS), 6),
        round(-0.5 / (0.5 + EPS), 6),
    }


def test_zero_variance_groups_get_zero_advantage_and_can_be_dropped() -> None:
    flat = [trajectory(f"f{i}", "flat", 1.0, [3]) for i in range(4)]
    kept = build_flow_grpo_rows(hand_group() + flat, "paper")
    assert all(r.advantage == 0 for r in kept.rows if r.group_id == "flat")
    assert kept.stats["zero_variance_share"] == 0.5
    dropped = build_flow_grpo_rows(hand_group() + flat, "paper", drop_zero_variance=True)
    assert {r.group_id for r in dropped.rows} == {"g"}
    assert sum(r.token_weight * len(r.completion_ids) for r in dropped.rows) == pytest.approx(1)


def test_lengths_nodes_and_refusals() -> None:
    batch = build_flow_grpo_rows(
        hand_group(), "paper", max_completion_length=3, max_prompt_length=10
    )
    assert all(len(r.completion_ids) == len(r.old_logprobs) <= 3 for r in batch.rows)
    assert batch.stats["rows_cut"] == 4 and batch.stats["rows_dropped"] == 0  # 4, 5, 6, 7
    short = build_flow_grpo_rows(hand_group(), max_prompt_length=2).stats
    assert (short["rows_dropped"], short["trajectories_dropped"], short["rows"]) == (8, 4, 0)
    both = build_flow_grpo_rows(hand_group(), nodes=("planner", "generator"))
    assert both.stats["rows"] == 12
    bad = hand_group()
    bad[1].transitions[0]["completion_ids"] = None
    with pytest.raises(ValueError, match="plain chat model"):
        build_flow_grpo_rows(bad)
    with pytest.raises(ValueError, match="unknown mode"):
        build_flow_grpo_rows(hand_group(), "token")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode 'official' is now 'verl_like'"):
        build_flow_grpo_rows(hand_group(), "official")  # type: ignore[arg-type]


def reference_objective(trajectories: list[Trajectory], ratios: dict, lo: float, hi: float):  # type: ignore[no-untyped-def]
    """Paper Eq. 10 written out directly: mean over questions of
    (1/G) sum_i (1/T_i) sum_t (1/|a|) sum_j min(r A_i, clip(r, 1-lo, 1+hi) A_i)."""
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    total = 0.0
    for members in groups.values():
        rewards = [m.reward for m in members]
        mean = sum(rewards) / len(rewards)
        std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        group_sum = 0.0
        for m in members:
            adv = (m.reward - mean) / (std + EPS)
            turns = [t for t in m.transitions if t["node"] == "planner"]
            traj_sum = 0.0
            for t in turns:
                rs = ratios[(m.trajectory_id, t["turn"])]
                traj_sum += sum(min(r * adv, min(max(r, 1 - lo), 1 + hi) * adv) for r in rs) / len(
                    rs
                )
            group_sum += traj_sum / len(turns)
        total += group_sum / len(members)
    return total / len(groups)


def test_rows_reproduce_the_papers_objective_on_a_random_batch() -> None:
    rng = random.Random(0)
    trajectories = []
    for g in range(5):
        for i in range(4):
            lengths = [rng.randint(1, 9) for _ in range(rng.randint(1, 4))]
            trajectories.append(trajectory(f"{g}-{i}", f"g{g}", float(rng.random() < 0.5), lengths))
    ratios = {
        (t.trajectory_id, tr["turn"]): [math.exp(rng.gauss(0, 0.3)) for _ in tr["completion_ids"]]
        for t in trajectories
        for tr in t.transitions
        if tr["node"] == "planner"
    }
    rows = build_flow_grpo_rows(trajectories, "paper").rows
    ours = sum(
        row.token_weight * min(r * row.advantage, min(max(r, 0.8), 1.3) * row.advantage)
        for row in rows
        for r in ratios[(row.trajectory_id, row.turn)]
    )
    assert ours == pytest.approx(reference_objective(trajectories, ratios, 0.2, 0.3), abs=1e-6)


def test_step_credit_groups_turns_that_saw_the_same_input() -> None:
    from flowlearn.training import StepCredit

    group = hand_group()
    # every first turn saw the same prompt; later turns differ across trajectories
    for index, trajectory in enumerate(group):
        for transition in trajectory.transitions:
            transition["prompt_ids"] = (
                [1, 2, 3] if transition["turn"] == 1 else [9, transition["turn"], index]
            )
    plain = build_flow_grpo_rows(group, "paper")
    credited = build_flow_grpo_rows(group, "paper", step_credit=StepCredit(weight=0.5, gamma=0.9))
    assert credited.stats["step_groups"] == 1  # only the shared first turn forms a group
    first = [r for r in credited.rows if r.turn == 1]
    # discounted returns of the first turns: R * 0.9^(T-1) for T = [1, 3, 2, 2]
    values = [1.0, 0.0, 0.0, 0.9]
    mean = sum(values) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 4)
    for row, value in zip(first, values, strict=True):
        base = next(r for r in plain.rows if r.trajectory_id == row.trajectory_id and r.turn == 1)
        assert row.advantage == pytest.approx(base.advantage + 0.5 * (value - mean) / (std + EPS))
    later = [(r, p) for r, p in zip(credited.rows, plain.rows, strict=True) if r.turn > 1]
    assert all(r.advantage == p.advantage for r, p in later)


def test_turns_cut_off_by_their_budget_are_left_out_under_mask_truncated() -> None:
    """TRL's `mask_truncated_completions` (DAPO's overlong filter), per turn of a flow."""
    group = [trajectory(f"t{i}", "g", float(i % 2), [3, 4]) for i in range(4)]
    for t in group:  # the first turn ran out of its budget of 3 tokens, the second ended at 4 of 8
        t.transitions[0]["sampling"] = {"temperature": 1.0, "max_new_tokens": 3}
        t.transitions[1]["sampling"] = {"temperature": 1.0, "max_new_tokens": 8}
    kept = build_flow_grpo_rows(group, "paper")
    assert (kept.stats["rows"], kept.stats["rows_truncated"]) == (8, 0)
    masked = build_flow_grpo_rows(group, "paper", mask_truncated=True)
    assert (masked.stats["rows"], masked.stats["rows_truncated"]) == (4, 4)
    assert {r.turn for r in masked.rows} == {2}
    # the advantages are the outcome's, as before: the cut-off turns only leave the loss
    assert sorted({r.advantage for r in masked.rows}) == sorted({r.advantage for r in kept.rows})
    assert sum(r.token_weight * len(r.completion_ids) for r in masked.rows) == pytest.approx(1)
    # past max_completion_length counts as cut off too (kept and cut without the mask)
    longer = build_flow_grpo_rows(group, "paper", mask_truncated=True, max_completion_length=3)
    assert (longer.stats["rows"], longer.stats["rows_truncated"]) == (0, 8)
    assert longer.stats["trajectories_dropped"] == 4
    # a turn whose last token ends a completion (EOS, pad) ended by itself on its budget
    assert {t.transitions[0]["completion_ids"][-1] for t in group} == {2}  # ids 0, 1, 2
    ended = build_flow_grpo_rows(group, "paper", mask_truncated=True, end_ids={2, 99})
    assert (ended.stats["rows"], ended.stats["rows_truncated"]) == (8, 0)
