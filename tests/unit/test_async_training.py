"""Asynchronous Flow-GRPO: rollouts made ahead of the trainer, within `max_staleness` updates."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")

import torch
from test_trainer_online import CASES, engine, lookup, scorer
from trainer_setup import CONTEXT, config, load

from flowlearn.evals.cases import Case
from flowlearn.training import TrajectoryStore
from flowlearn.training.producer import (
    Lookahead,
    ProducerError,
    RolloutProducer,
    snapshot_of,
    version_of,
)
from flowlearn.training.trainer import FlowGRPOTrainer, read_metrics

QUESTIONS = [Case(str(i), f"q{i}", "a") for i in range(4)]


class Recorder:
    """A stand-in `roll`: records the version each step was sampled with; may block or fail."""

    def __init__(self, fail_at: int | None = None, hold: threading.Event | None = None) -> None:
        self.versions: dict[int, int] = {}
        self.fail_at, self.hold = fail_at, hold

    def __call__(self, model: Any, cases: list[Case], step: int, version: int) -> list[Any]:
        if self.hold is not None:
            self.hold.wait()
        if step == self.fail_at:
            raise RuntimeError("the search server went away")
        self.versions[step] = version
        return [step]


def producer(roll: Recorder, staleness: int = 1, stall_after: float = 30.0) -> RolloutProducer:
    snapshot = torch.nn.Linear(1, 1)  # no weights published: `publish(..., {})`
    return RolloutProducer(
        roll, snapshot, version=0, max_staleness=staleness, stall_after=stall_after
    )


def test_steps_are_rolled_out_ahead_but_never_past_the_staleness_bound() -> None:
    roll = Recorder()
    made = producer(roll, staleness=1)
    for step in range(4):
        made.submit(step, QUESTIONS[:1])
    first, _ = made.take(0)
    second, _ = made.take(1)  # made on version 0 too: before any update was published
    assert (first.version, second.version) == (0, 0)
    time.sleep(0.2)
    assert 2 not in made.done  # step 2 needs version 1 at least
    made.publish(1, {})
    third, _ = made.take(2)
    made.publish(2, {})
    fourth, _ = made.take(3)
    assert [third.version, fourth.version] == [1, 2]
    assert all(step - version <= 1 for step, version in roll.versions.items())
    made.stop()


def test_staleness_zero_waits_for_every_update() -> None:
    roll = Recorder()
    made = producer(roll, staleness=0)
    made.submit(0, QUESTIONS[:1])
    made.submit(1, QUESTIONS[:1])
    made.take(0)
    time.sleep(0.2)
    assert 1 not in made.done
    made.publish(1, {})
    assert made.take(1)[0].version == 1
    made.stop()


def test_a_crashed_producer_ends_the_run_with_its_error() -> None:
    made = producer(Recorder(fail_at=1))
    made.submit(0, QUESTIONS[:1])
    made.submit(1, QUESTIONS[:1])
    made.take(0)
    made.publish(1, {})
    with pytest.raises(ProducerError, match="crashed while rolling out step 1") as caught:
        made.take(1)
    assert "search server went away" in str(caught.value.__cause__)


def test_a_stalled_producer_is_reported_not_waited_on() -> None:
    hold = threading.Event()
    made = producer(Recorder(hold=hold), stall_after=0.3)
    made.submit(0, QUESTIONS[:1])
    with pytest.raises(ProducerError, match=r"made no step in 0 s .*rolling out step 0"):
        made.take(0)
    made.stop()
    hold.set()


def test_steps_are_handed_over_in_order_once_each() -> None:
    made = producer(Recorder())
    made.submit(0, QUESTIONS[:1])
    made.submit(0, QUESTIONS[:1])  # again: ignored
    with pytest.raises(ProducerError, match="step 2 handed to the producer after 0"):
        made.submit(2, QUESTIONS[:1])
    with pytest.raises(ProducerError, match="never handed"):
        made.take(5)
    made.stop()


def test_lookahead_reads_ahead_without_losing_or_reordering_items() -> None:
    ahead = Lookahead(iter(range(5)))
    assert ahead.take(2) == [0, 1]
    ahead.fill(2)
    assert [ahead.peek(0), ahead.peek(1)] == [2, 3]
    assert ahead.take(2) == [2, 3]
    ahead.fill(3)
    assert ahead.take(3) == [4]  # the epoch's end
    assert ahead.ended


def test_a_snapshot_shares_frozen_weights_and_copies_trained_ones(tiny_model_dir: Path) -> None:
    model, _ = load(tiny_model_dir)
    frozen = model.get_input_embeddings().weight
    frozen.requires_grad_(False)
    snapshot = snapshot_of(model)
    assert snapshot.get_input_embeddings().weight is frozen
    trained = next(p for p in model.parameters() if p.requires_grad)
    copied = next(p for p in snapshot.parameters() if p.shape == trained.shape and p is not trained)
    assert copied.data_ptr() != trained.data_ptr() and not copied.requires_grad
    assert not snapshot.training


def test_a_snapshot_runs_its_own_weights_after_trl_patched_the_forward(
    tiny_model_dir: Path,
) -> None:
    from trl.trainer.utils import add_fused_lm_head

    live, _ = load(tiny_model_dir)
    add_fused_lm_head(live, temperature=0.7)  # as GRPOTrainer.__init__ does
    snapshot = snapshot_of(live)
    ids = torch.tensor([[1, 2, 3]])
    before = snapshot(input_ids=ids).logits.clone()
    with torch.no_grad():
        next(p for p in live.parameters() if p.requires_grad).add_(1.0)
    assert torch.equal(before, snapshot(input_ids=ids).logits)


@pytest.mark.parametrize(
    ("policy_version", "expected"),
    [
        ("out@3", 3),
        ("out@0", 0),
        ("runs/a@b@12", 12),
        ("out@2:base", 2),
        ("out@5:verifier", 5),
        ("flow-ab12-step7", 7),
        ("flow-ab12-step7-verifier", 7),
        ("flow-ab12-step3-web-search", 3),  # node names may hold hyphens
        ("Qwen/Qwen2.5-7B@server", None),  # a served base: not a trained version
        ("x", None),
        (None, None),
    ],
)
def test_versions_are_read_from_the_transitions(policy_version: Any, expected: Any) -> None:
    assert version_of(policy_version) == expected


def online(tmp_path: Path, tiny_model_dir: Path, **overrides: Any) -> tuple[Any, Any]:
    model, tokenizer = load(tiny_model_dir)
    args = config(tmp_path, per_device_train_batch_size=8, num_generations=4, **overrides)
    args.max_staleness = 1  # type: ignore[attr-defined]
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    trainer = FlowGRPOTrainer.online(
        model,
        args=args,
        engine=engine(),
        tools=[lookup],
        scorer=scorer,
        cases=CASES,
        context=CONTEXT,
        processing_class=tokenizer,
        rollout_store=store,
    )
    return trainer, store


@pytest.mark.slow
def test_one_step_off_policy_training_records_versions_and_bounds_staleness(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    trainer, store = online(tmp_path, tiny_model_dir, max_steps=3)
    model = trainer.model
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()
    assert sum((before[k] - v).abs().sum().item() for k, v in model.state_dict().items()) > 0
    rollouts = store.load()
    assert len(rollouts) == 3 * 2 * 4  # every step's rollouts, none trained twice
    by_step: dict[str, set[int | None]] = {}
    for rollout in rollouts:
        step = rollout.trajectory_id.split(":", 1)[0]
        planner = [t for t in rollout.transitions if t["node"] == "planner"]
        by_step.setdefault(step, set()).update(version_of(t["policy_version"]) for t in planner)
    # step 1 was rolled out during update 1, on version 0; step 2 on the newest weights the
    # producer had when it began: version 1 (or 2, had update 2 ended by then)
    assert by_step["step0"] == {0} and by_step["step1"] == {0}
    assert by_step["step2"] in ({1}, {2})
    records = read_metrics(Path(trainer.args.output_dir) / "metrics.jsonl")
    assert [r["flow/staleness"] for r in records][:2] == [0, 1]
    assert records[2]["flow/staleness"] in (0, 1)
    assert all(r["flow/row_staleness_max"] <= 1 for r in records)
    assert records[1]["flow/stale_rows"] > 0  # importance-corrected, ratio logged
    for key in ("flow/is_ratio_min", "flow/is_ratio_max", "flow/is_ratio_std"):
        assert key in records[1]
    assert 0.0 <= records[1]["flow/is_capped_share"] <= 1.0
    assert records[1]["flow/is_ratio_max"] <= 2.0  # the truncation cap
    assert {"flow/trainer_wait_s", "flow/producer_wait_s"} <= set(records[1])


@pytest.mark.slow
def test_a_producer_crash_mid_run_keeps_the_last_checkpoint(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    trainer, _ = online(tmp_path, tiny_model_dir, max_steps=3, save_strategy="steps", save_steps=1)
    rolls = trainer.rollouts_ahead
    real = rolls.roll

    def roll(model: Any, cases: list[Case], step: int, version: int) -> list[Any]:
        if step == 2:
            raise RuntimeError("sandbox gone")
        return real(model, cases, step, version)

    rolls.roll = roll  # type: ignore[method-assign]
    with pytest.raises(ProducerError, match=r"crashed while rolling out step 2.*sandbox gone"):
        trainer.train()
    checkpoint = Path(trainer.args.output_dir) / "checkpoint-2"
    assert (checkpoint / "model.safetensors").is_file()
    assert rolls.producer is None  # stopped
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(checkpoint)  # the last checkpoint loads
    assert all(torch.isfinite(p).all() for p in loaded.parameters())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"steps_per_generation": 2}, "steps_per_generation 2 with gradient_accumulation_steps 1"),
        ({"num_iterations": 2}, "num_iterations 2"),
    ],
)
def test_what_it_does_not_run_yet_is_refused_by_name(
    tiny_model_dir: Path, tmp_path: Path, overrides: dict[str, Any], message: str
) -> None:
    trainer, _ = online(tmp_path, tiny_model_dir, **overrides)
    with pytest.raises(ValueError, match=f"max_staleness 1 .*{message}"):
        trainer.train()


def test_rollouts_older_than_the_bound_are_never_trained() -> None:
    from flowlearn.training.producer import drop_too_stale
    from flowlearn.training.trajectories import DROPPED, Trajectory

    def rollout(*versions: str) -> Trajectory:
        calls = [{"node": "planner", "policy_version": v} for v in versions]
        return Trajectory("t", "g", "q", "a", "a", "a", 1.0, transitions=calls)  # type: ignore[arg-type]

    fresh, old, engine_only = rollout("out@4", "out@5"), rollout("out@2"), rollout("scripted@0")
    assert drop_too_stale([fresh, old, engine_only], oldest=4, trained="out@") == 1
    assert DROPPED in old.metadata and "version 2" in old.metadata[DROPPED]
    assert DROPPED not in fresh.metadata and DROPPED not in engine_only.metadata


def test_the_yaml_sets_the_staleness_and_bad_values_are_refused(tmp_path: Path) -> None:
    from flowlearn.training.config import check_settings, context_from, parse_config

    file = tmp_path / "train.yaml"
    file.write_text(f"max_staleness: 1\nstale_importance_cap: 3.0\noutput_dir: {tmp_path}/o\n")
    config = parse_config(["--config", str(file), "--use_cpu", "true"])
    assert (config.max_staleness, config.stale_importance_cap, config.producer_stall_s) == (
        1,
        3.0,
        600.0,
    )
    for key, value, message in [
        ("max_staleness", -1, "max_staleness must be a whole number >= 0"),
        ("stale_importance_cap", 0.0, "stale_importance_cap must be > 0"),
        ("producer_stall_s", 0.0, "producer_stall_s must be > 0"),
    ]:
        bad = parse_config(["--config", str(file), "--use_cpu", "true"])
        setattr(bad, key, value)
        with pytest.raises(ValueError, match=message):
            check_settings(bad, context_from(bad), 100, offline=False)


@pytest.mark.slow
def test_a_trained_verifier_adapter_trains_one_step_off_policy(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from test_trained_roles import adapter_weights, with_adapters
    from transformers import AutoTokenizer

    from flowlearn.engine.scripted import ScriptedPolicy, planner_turn
    from flowlearn.graphs import build_agentflow

    def factory(policies: Any) -> Any:  # the verifier trains on its adapter; a scripted planner
        planner = ScriptedPolicy([planner_turn("lookup")])
        return build_agentflow(planner, engine(), [lookup], verifier_policy=policies["verifier"])

    model = with_adapters(tiny_model_dir, ("planner", "verifier"))
    start = adapter_weights(model, "verifier")
    args = config(tmp_path, per_device_train_batch_size=8, num_generations=4, max_steps=2)
    args.max_staleness = 1  # type: ignore[attr-defined]
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    trainer = FlowGRPOTrainer.online(
        model,
        args=args,
        graph_factory=factory,
        scorer=scorer,
        cases=CASES,
        context=CONTEXT,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        rollout_store=store,
        nodes=["verifier"],
    )
    trainer.train()
    after = adapter_weights(model, "verifier")
    assert any(not torch.equal(start[k], after[k]) for k in after)
    for rollout in store.load():
        step = int(rollout.trajectory_id.split(":", 1)[0].removeprefix("step"))
        calls = [t for t in rollout.transitions if t["node"] == "verifier"]
        assert calls and all(t.get("completion_ids") for t in calls)
        assert {t["policy_version"].rsplit(":", 1)[1] for t in calls} == {"verifier"}
        versions = {version_of(t["policy_version"]) for t in calls}
        assert all(v is not None and step - 1 <= v <= step for v in versions), versions
    records = read_metrics(Path(trainer.args.output_dir) / "metrics.jsonl")
    assert records[1]["flow/staleness"] == 1 and records[1]["flow/stale_rows"] > 0


@pytest.mark.slow
def test_flowlearn_train_runs_off_policy_and_resumes_without_training_a_step_twice(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import json

    from flowlearn.cli import main

    out = tmp_path / "train"
    config_file = tmp_path / "train.yaml"
    config_file.write_text(
        f"planner: {tiny_model_dir}\nbenchmark: gameof24\nlimit: 8\nnum_generations: 2\n"
        f"questions_per_step: 1\nmax_turns: 1\nmax_completion_length: 8\n"
        f"engine_max_new_tokens: 8\nlearning_rate: 0.001\nsave_steps: 1\nmax_steps: 2\n"
        f"max_staleness: 1\noutput_dir: {out}\nbf16: false\n"
    )
    assert main(["train", "--config", str(config_file)]) == 0
    assert main(["train", "--config", str(config_file), "--max-steps", "4", "--resume"]) == 0
    state = json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").open()]
    steps = [r["trajectory_id"].split(":", 1)[0] for r in rollouts]
    assert sorted(set(steps)) == ["step0", "step1", "step2", "step3"]
    assert len(steps) == 4 * 2  # each step's 2 rollouts stored once: none made twice
    for rollout in rollouts:
        step = int(rollout["trajectory_id"].split(":", 1)[0].removeprefix("step"))
        planner = [t for t in rollout["transitions"] if t["node"] == "planner"]
        assert all(step - 1 <= version_of(t["policy_version"]) <= step for t in planner)
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["flow/row_staleness_max"] <= 1 for r in records)


@pytest.mark.slow
def test_a_run_set_by_epochs_rolls_out_no_step_it_will_not_train(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    trainer, store = online(tmp_path, tiny_model_dir, max_steps=-1, num_train_epochs=1.5)
    trainer.train()
    assert trainer.state.global_step == 3  # 4 questions, 2 a step: 1.5 epochs
    steps = {r.trajectory_id.split(":", 1)[0] for r in store.load()}
    assert steps == {"step0", "step1", "step2"}
    assert trainer.rollouts_ahead.producer is None and trainer.rollouts_ahead._handle is None


@pytest.mark.slow
def test_the_frozen_base_as_engine_runs_on_the_producers_snapshot(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import json

    from flowlearn.cli import main

    out = tmp_path / "lora"
    flags = [
        *("--planner", str(tiny_model_dir), "--benchmark", "gameof24", "--limit", "6"),
        *("--num_generations", "2", "--questions-per-step", "2", "--max-turns", "1"),
        *("--max_completion_length", "8", "--engine-max-new-tokens", "8", "--max-steps", "3"),
        *("--lora", "--engine", "base", "--learning_rate", "0.01", "--max_staleness", "1"),
        *("--bf16", "false", "--output-dir", str(out)),
    ]
    assert main(["train", *flags]) == 0
    assert (out / "final-adapter" / "adapter_config.json").exists()
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").open()]
    assert {r["trajectory_id"].split(":", 1)[0] for r in rollouts} == {"step0", "step1", "step2"}
    for rollout in rollouts:
        step = int(rollout["trajectory_id"].split(":", 1)[0].removeprefix("step"))
        planner = [t for t in rollout["transitions"] if t["node"] == "planner"]
        assert all(step - 1 <= version_of(t["policy_version"]) <= step for t in planner)
        assert rollout["transitions"][-1]["node"] == "generator"  # the engine answered
    records = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert records[1]["flow/staleness"] == 1


def test_stale_rows_of_each_node_are_scored_under_that_nodes_adapter(
    tiny_model_dir: Path,
) -> None:
    import collections
    import types

    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from flowlearn.engine.adapters import active_adapter, switch_adapter
    from flowlearn.training.producer import AsyncRollouts
    from flowlearn.training.roles import with_node_adapters
    from flowlearn.training.rows import FlowGRPORow

    def settings() -> LoraConfig:  # random B: each adapter scores its own way
        return LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = with_node_adapters(base, {"planner": settings(), "verifier": settings()})

    def logps(model: Any, ids: Any, mask: Any, keep: int, batch_size: Any = None) -> Any:
        logits = model(input_ids=ids, attention_mask=mask).logits[:, -keep - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[:, -keep:, None])[..., 0], None, None

    trainer = types.SimpleNamespace(
        args=types.SimpleNamespace(
            output_dir="out", stale_importance_cap=2.0, per_device_train_batch_size=4
        ),
        state=types.SimpleNamespace(global_step=2),
        roles=types.SimpleNamespace(nodes=("planner", "verifier")),
        accelerator=types.SimpleNamespace(unwrap_model=lambda m: m, device="cpu"),
        processing_class=types.SimpleNamespace(pad_token_id=0),
        model=model,
        server=None,
        _metrics={"train": collections.defaultdict(list)},
        _get_per_token_logps_and_entropies=logps,
    )
    rows = [
        FlowGRPORow(
            "t",
            "g",
            0,
            [5, 6, 7],
            [8, 9, 10],
            [-3.0] * 3,
            1.0,
            1.0,
            1.0,
            node=node,
            policy_version=f"out@1:{node}",
        )
        for node in ("planner", "verifier")
    ]
    switch_adapter(model, "verifier")  # as the previous step's last loss part leaves it
    rolls = AsyncRollouts.__new__(AsyncRollouts)
    rolls.trainer = trainer
    rolls.correct(rows)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    for row in rows:
        with torch.no_grad(), active_adapter(model, row.node):
            truth = logps(model, ids, torch.ones_like(ids), 3)[0][0]
        assert torch.allclose(torch.tensor(row.old_logprobs), truth, atol=1e-5), row.node
        assert row.token_scales is not None and max(row.token_scales) <= 2.0
