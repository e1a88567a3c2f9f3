"""Provenance: rows sampled otherwise are refused; runs have ids; stored rollouts stay in theirs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from stand_in_server import Recorded, Reply, stand_in_server

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.nodes import policy_transition
from flowlearn.nodes.policies.server import ServerPolicy
from flowlearn.nodes.schema.sampling import Sampling
from flowlearn.training import (
    StepCredit,
    Trajectory,
    TrajectoryStore,
    Transition,
    build_flow_grpo_rows,
    collect,
)
from flowlearn.training.provenance import DROPPED
from flowlearn.training.rollouts import Rollouts

EPS = 1e-6
TRAINER = Sampling(temperature=0.7, top_p=1.0)


def turn(
    tid: str, t: int, *, node: str = "planner", length: int = 3, **sampling: Any
) -> Transition:
    record = Transition(
        trajectory_id=tid,
        group_id="g",
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
    if sampling:
        record["sampling"] = {"temperature": 0.7, "top_p": 1.0, **sampling}
    return record


def rollout(tid: str, reward: float, transitions: list[Transition]) -> Trajectory:
    return Trajectory(
        trajectory_id=tid,
        group_id="g",
        question="q",
        reference="r",
        answer="a",
        final_text="a",
        reward=reward,
        transitions=transitions,
    )


def group(**sampling: Any) -> list[Trajectory]:
    """Rewards 1, 0; the second trajectory's second turn carries `sampling`."""
    return [
        rollout("t0", 1.0, [turn("t0", 1, temperature=0.7)]),
        rollout("t1", 0.0, [turn("t1", 1, temperature=0.7), turn("t1", 2, **sampling)]),
    ]


def test_a_row_sampled_at_another_temperature_is_refused() -> None:
    with pytest.raises(ValueError) as refused:
        build_flow_grpo_rows(group(temperature=0.5), sampling=TRAINER)
    message = str(refused.value)
    assert "trajectory 't1' turn 2" in message
    assert "temperature 0.5" in message and "temperature 0.7" in message
    accepted = build_flow_grpo_rows(group(temperature=0.7), sampling=TRAINER)
    assert accepted.stats["rows"] == 3
    unrecorded = build_flow_grpo_rows([rollout("u", 1.0, [turn("u", 1)])], sampling=TRAINER)
    assert unrecorded.stats["rows"] == 1  # no recorded sampling: nothing to check against


@pytest.mark.parametrize(
    ("sampling", "refusal"),
    [
        ({"top_p": 0.9, "logprobs_mode": "processed"}, "processed logprobs"),
        ({"top_p": 1.0, "logprobs_mode": "processed"}, None),  # no nucleus: processed = full
        ({"top_p": 0.9}, None),  # HFPolicy: full-distribution logprobs at any top_p
        ({"top_p": 0.9, "temperature": 1.0, "logprobs_mode": "raw"}, "temperature 1.0"),
        ({"top_p": 1.0, "logprobs_mode": "raw"}, "raw logprobs"),  # raw at 0.7: untempered
    ],
)
def test_processed_logprobs_under_top_p_are_refused(
    sampling: dict[str, Any], refusal: str | None
) -> None:
    if refusal is None:
        assert build_flow_grpo_rows(group(**sampling), sampling=TRAINER).stats["rows"] == 3
        return
    with pytest.raises(ValueError, match=refusal) as refused:
        build_flow_grpo_rows(group(**sampling), sampling=TRAINER)
    assert "trajectory 't1' turn 2" in str(refused.value)


def test_raw_logprobs_at_temperature_1_train_with_a_trainer_at_1() -> None:
    data = [
        rollout("a", 1.0, [turn("a", 1, temperature=1.0, top_p=0.9, logprobs_mode="raw")]),
        rollout("b", 0.0, [turn("b", 1, temperature=1.0, top_p=0.9, logprobs_mode="raw")]),
    ]
    assert build_flow_grpo_rows(data, sampling=Sampling(temperature=1.0)).stats["rows"] == 2


def vllm_reply(request: Recorded) -> Reply:
    choice = {
        "message": {"role": "assistant", "content": "ok"},
        "logprobs": {"content": [{"token": "token_id:7", "logprob": -0.4}]},
        "token_ids": [7],
    }
    return Reply(200, {"choices": [choice], "prompt_token_ids": [1, 2]})


def test_the_server_policy_records_processed_logprobs_and_training_refuses_them() -> None:
    with stand_in_server(vllm_reply) as server:
        policy = ServerPolicy(f"{server.url}/v1", "tiny", api_key_env=None)
        nucleus = policy.generate([{"role": "user", "content": "hi"}], Sampling(top_p=0.9))
        full = policy.generate([{"role": "user", "content": "hi"}], Sampling(top_p=1.0))
        policy.close()
    assert nucleus.sampling["logprobs_mode"] == "processed" and nucleus.token_faithful

    def stored(gen: Any) -> list[Trajectory]:
        calls = [policy_transition("planner", 1, [], gen) for _ in range(2)]
        for i, call in enumerate(calls):
            call["trajectory_id"] = f"s{i}"
        return [rollout("s0", 1.0, calls[:1]), rollout("s1", 0.0, calls[1:])]

    with pytest.raises(ValueError, match=r"trajectory 's0' turn 1 has processed.*top-p 0\.9"):
        build_flow_grpo_rows(stored(nucleus), sampling=TRAINER)
    assert build_flow_grpo_rows(stored(full), sampling=TRAINER).stats["rows"] == 2


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
    from flowlearn.training.metrics import flow_metrics

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


class CountingGraph:
    """A graph of one planner call that answers at once, and counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def invoke(self, inputs: dict[str, Any], context: Any = None) -> dict[str, Any]:
        self.runs += 1
        call = turn("set when stored", 1, temperature=0.7)
        return {"question": inputs["question"], "answer": "x", "transitions": [call]}


def judge(answer: str, case: Case) -> Score:
    if case.id == "bad":
        raise TimeoutError("judge timed out")
    return Score(1.0 if answer == case.reference else 0.0, "exact match")


CASES = [Case("a", "A?", "x"), Case("bad", "B?", "x")]


def test_rollouts_carry_the_run_id_and_reward_errors_come_back_marked(tmp_path: Path) -> None:
    graph = CountingGraph()
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    source = Rollouts(
        lambda policy: graph, judge, CASES, store=store, concurrency=1, reward_errors="drop"
    )
    source.run_id = "r1"
    out = source.run(None, CASES, group_size=2, context=None, step=3, rank=0)  # type: ignore[arg-type]
    ids = ["step3:a/0@r1", "step3:a/1@r1", "step3:bad/0@r1", "step3:bad/1@r1"]
    assert [t.trajectory_id for t in out] == ids
    assert all(t.metadata["run_id"] == "r1" for t in store.load())
    assert [bool(t.metadata.get(DROPPED)) for t in out] == [False, False, True, True]
    batch = build_flow_grpo_rows(out, sampling=TRAINER)
    assert (batch.stats["trajectories_dropped"], batch.stats["rows"]) == (2, 2)


def test_stored_rollouts_are_reused_only_by_their_own_run(tmp_path: Path) -> None:
    graph = CountingGraph()
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    collect(graph, CASES[:1], judge, group_size=2, store=store, progress=False, run_id="r1")
    assert graph.runs == 2
    again = collect(graph, CASES[:1], judge, group_size=2, store=store, progress=False, run_id="r1")
    assert graph.runs == 2 and len(again) == 2  # the same run: reused
    other = collect(graph, CASES[:1], judge, group_size=2, store=store, progress=False, run_id="r2")
    assert graph.runs == 4 and {t.metadata["run_id"] for t in other} == {"r2"}  # never reused


def flow_config(out: Path, **overrides: Any) -> Any:
    from flowlearn.training.config import FlowGRPOConfig

    values: dict[str, Any] = dict(benchmark="gameof24", output_dir=str(out), report_to="none")
    return FlowGRPOConfig(**{**values, **overrides})


def test_a_run_id_is_made_once_and_kept_on_resume(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.training.run_record import RUN_FILE, check_run, open_run

    out = tmp_path / "out"
    first = open_run(flow_config(out), resuming=False)
    record = json.loads((out / RUN_FILE).read_text())
    assert record["run_id"] == first and record["rollout_settings"]["temperature"] == 0.7
    (out / "rollouts.jsonl").write_text('{"trajectory_id": "step0:a/0@' + first + '"}\n')
    assert check_run(flow_config(out), resuming=True) == first
    assert open_run(flow_config(out, learning_rate=1e-3), resuming=True) == first  # update-only
    assert open_run(flow_config(tmp_path / "other"), resuming=False) != first


def test_a_fresh_run_beside_stored_rollouts_is_refused_and_nothing_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("trl")
    from flowlearn.cli import main
    from flowlearn.training.run_record import check_run, open_run

    out = tmp_path / "out"
    run_id = open_run(flow_config(out), resuming=False)
    (out / "rollouts.rank1.jsonl").write_text('{"trajectory_id": "x"}\n')
    with pytest.raises(ValueError, match=f"rollouts of run {run_id}.*pass --resume"):
        check_run(flow_config(out), resuming=False)
    assert main(["train", "--benchmark", "gameof24", "--output-dir", str(out)]) == 2
    error = capsys.readouterr().err
    assert "pass --resume to continue that run, or choose another output_dir" in error
    assert (out / "rollouts.rank1.jsonl").read_text() == '{"trajectory_id": "x"}\n'
    assert check_run(flow_config(tmp_path / "empty"), resuming=False) is None


def test_resume_with_other_rollout_settings_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.training.run import resume_point
    from flowlearn.training.run_record import check_run, open_run

    out = tmp_path / "out"
    run_id = open_run(flow_config(out, max_turns=2), resuming=False)
    # stopped before its first checkpoint: --resume starts it again, same id and rollouts
    assert resume_point(flow_config(out, resume=True)) is None
    with pytest.raises(ValueError, match="no complete checkpoint"):
        resume_point(flow_config(tmp_path / "never", resume=True))
    (out / "rollouts.jsonl").write_text('{"trajectory_id": "x"}\n')
    with pytest.raises(ValueError, match=r"max_turns 2, now 3; temperature 0\.7, now 0\.5"):
        check_run(flow_config(out, temperature=0.5), resuming=True)
    assert check_run(flow_config(out, max_turns=2), resuming=True) == run_id


def test_max_completion_length_is_the_planners_budget() -> None:
    pytest.importorskip("trl")
    from flowlearn.graphs import Context
    from flowlearn.training.config import check_settings

    args = flow_config(Path("unused"), max_completion_length=16)
    with pytest.raises(ValueError, match="max_completion_length 16 differs from the planner's"):
        check_settings(args, Context(planner_max_new_tokens=12), 99, offline=False)
    check_settings(args, Context(planner_max_new_tokens=16), 99, offline=False)
    check_settings(args, Context(planner_max_new_tokens=12), 99, offline=True)  # no rollouts


def test_the_trainer_refuses_offline_rows_sampled_otherwise_and_logs_what_it_cut(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from flowlearn.nodes.policies.hf import HFPolicy
    from flowlearn.training.trainer import FlowGRPOTrainer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    policy = HFPolicy(model, tokenizer)

    def sampled(temperature: float) -> list[Trajectory]:
        out = []
        for i, reward in enumerate([1.0, 0.0]):
            messages = [{"role": "user", "content": f"pick {i}"}]
            gen = policy.generate(messages, Sampling(temperature=temperature, max_new_tokens=6))
            call = policy_transition("planner", 1, messages, gen)
            call["trajectory_id"] = f"t{i}"
            out.append(rollout(f"t{i}", reward, [call]))
        return out

    def trainer(data: list[Trajectory]) -> Any:
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=2,
            num_generations=2,
            max_steps=1,
            temperature=0.7,
            loss_type="dapo",
            beta=0.0,
            max_completion_length=2,  # cuts every 6-token completion
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
        )
        return FlowGRPOTrainer.offline(
            model, args=args, trajectories=data, processing_class=tokenizer
        )

    with pytest.raises(ValueError, match=r"trajectory 't0' turn 1 was sampled at temperature 0\.5"):
        trainer(sampled(0.5)).train()
    matching = trainer(sampled(0.7))
    matching.train()
    (logged,) = [h for h in matching.state.log_history if "flow/rows" in h]
    assert logged["flow/rows"] == 2 and logged["flow/rows_cut"] == 2
    assert logged["flow/rows_dropped"] == logged["flow/trajectories_dropped"] == 0
