"""Red-team attacks on recorded token ids and logprobs: refused on every read path, never trained.

`collect` once stored completion ids -5 and 10**12 (vocabulary 400) and logprobs of +3 and
1e308 from a lying server; training crashed on the ids (`IndexError`) and, on the logprobs,
exited 0 with loss 0 and wrote `final/`. The server's reply is now refused where it arrives
(`tests/unit/test_redteam_served.py`); these are the files and in-memory rows it would have
left behind, from a server of another model or an edited file.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from flowlearn.errors import DataError
from flowlearn.outputs import MARKER
from flowlearn.training.rows import build_flow_grpo_rows
from flowlearn.training.trajectories import (
    Trajectory,
    TrajectoryStore,
    export_parquet,
    load_trajectories,
)

# (field, value spliced in at index 1, what the message says)
BAD_TOKENS = [
    ("completion_ids", -5, "completion_ids[1] = -5 (a negative token id)"),
    ("completion_ids", "7", "completion_ids[1] = '7' (not a whole number)"),
    ("completion_ids", 7.0, "completion_ids[1] = 7.0 (not a whole number)"),
    ("completion_ids", True, "completion_ids[1] = True (not a whole number)"),
    ("prompt_ids", -1, "prompt_ids[1] = -1 (a negative token id)"),
    ("logprobs", 3.0, "logprobs[1] = 3.0 (above 0: not a log-probability)"),
    ("logprobs", 7, "logprobs[1] = 7 (above 0"),
    ("logprobs", 1e308, "logprobs[1] = 1e+308 (above 0"),
    ("logprobs", -1e308, "logprobs[1] = -1e+308 (below -1000"),
    ("logprobs", "-0.5", "logprobs[1] = '-0.5' (not a finite number)"),
]


def trajectory(index: int, **transition: Any) -> Trajectory:
    """A rewarded one-turn trajectory of group `g`, its planner turn changed by `transition`."""
    turn: dict[str, Any] = {
        "node": "planner",
        "turn": 1,
        "messages": [],
        "output": "x",
        "parse_status": "ok",
        "seconds": 0.0,
        "prompt_ids": [1, 2, 3],
        "completion_ids": [4, 5, 6],
        "logprobs": [-0.1, -0.2, -0.3],
        "trajectory_id": f"g/{index}",
        "group_id": "g",
    }
    turn.update(transition)
    return Trajectory(
        trajectory_id=f"g/{index}",
        group_id="g",
        question="q",
        reference="r",
        answer="a",
        final_text="a",
        reward=float(index % 2),
        transitions=[turn],  # type: ignore[list-item]
    )


def poisoned(name: str, value: Any) -> dict[str, Any]:
    data = trajectory(1).to_dict()
    data["transitions"][0][name][1] = value
    return data


def write_store(path: Path, bad: dict[str, Any]) -> Path:
    path.write_text(trajectory(0).to_json() + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("name", "value", "says"), BAD_TOKENS)
def test_a_store_refuses_a_bad_id_or_logprob_naming_file_line_and_field(
    tmp_path: Path, name: str, value: Any, says: str
) -> None:
    path = write_store(tmp_path / "t.jsonl", poisoned(name, value))
    expected = re.escape(f"t.jsonl:2: field transitions[0].{says}")
    with pytest.raises(DataError, match=expected):
        TrajectoryStore(path).load()
    with pytest.raises(DataError, match=r"t\.jsonl:2: .*logprobs finite numbers <= 0"):
        load_trajectories(path)  # the offline trainer's reader, with the rule in the message


def test_a_parquet_export_with_a_bad_id_is_refused(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    bad = trajectory(1)
    bad.transitions[0]["completion_ids"] = [4, -5, 6]  # as a foreign writer could have
    path = export_parquet([trajectory(0), bad], tmp_path / "t.parquet")
    with pytest.raises(DataError, match=r"t\.parquet: row 2: field transitions\[0\]\.completion"):
        load_trajectories(path)


def test_appending_refuses_bad_tokens_and_writes_nothing(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "t.jsonl")
    with pytest.raises(DataError, match=r"'g/1': field transitions\[0\]\.logprobs\[0\] = 3\.0"):
        store.append(trajectory(1, logprobs=[3.0, -0.1, -0.1]))
    assert not (tmp_path / "t.jsonl").exists() or not (tmp_path / "t.jsonl").read_text()


def test_rows_refuse_ids_past_the_trained_vocabulary() -> None:
    good, bad = trajectory(0), trajectory(1, completion_ids=[4, 10**12, 6])
    with pytest.raises(
        DataError,
        match=r"planner transition of trajectory 'g/1' turn 1: field completion_ids\[1\] = "
        r"1000000000000 \(outside the vocabulary of 400 tokens\)",
    ):
        build_flow_grpo_rows([good, bad], vocab_size=400)
    edge = trajectory(1, completion_ids=[4, 399, 6])
    assert len(build_flow_grpo_rows([good, edge], vocab_size=400).rows) == 2
    with pytest.raises(DataError, match=r"'g/1': field transitions\[0\]\.logprobs\[0\] = 3\.0"):
        build_flow_grpo_rows([good, trajectory(1, logprobs=[3.0, -0.1, -0.1])])


def test_a_logprob_a_hair_above_zero_is_float_rounding_and_passes() -> None:
    rounding = trajectory(1, logprobs=[2e-6, -0.1, 0.0])
    assert len(build_flow_grpo_rows([trajectory(0), rounding], vocab_size=400).rows) == 2


def test_offline_training_refuses_ids_past_the_vocabulary_before_any_update(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("trl")
    from offline_setup import CONTEXT, config, sampled
    from trainer_setup import load

    from flowlearn.engine.local import HFPolicy
    from flowlearn.training.trainer import FlowGRPOTrainer

    model, tokenizer = load(tiny_model_dir)
    trajectories = sampled(HFPolicy(model, tokenizer))
    trajectories[1].transitions[0]["completion_ids"][0] = len(tokenizer)  # one past the last
    trainer = FlowGRPOTrainer.offline(
        model,
        args=config(tmp_path, max_steps=1),
        trajectories=trajectories,
        context=CONTEXT,
        processing_class=tokenizer,
    )
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(DataError, match=r"completion_ids\[0\] = 400 \(outside the vocabulary"):
        trainer.train()  # it crashed with an IndexError in the embedding
    assert trainer.state.global_step == 0
    assert all((p == q).all() for p, q in zip(model.parameters(), before, strict=True))


@pytest.mark.parametrize(("name", "value"), [("logprobs", 3.0), ("completion_ids", -5)])
def test_train_on_a_file_with_bad_tokens_exits_naming_it_and_writes_nothing(
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    value: Any,
) -> None:
    pytest.importorskip("trl")
    from flowlearn.cli import main

    path = write_store(tmp_path / "poisoned.jsonl", poisoned(name, value))
    out = tmp_path / "out"
    argv = ["train", "--planner", str(tiny_model_dir), "--trajectories", str(path)]
    status = main([*argv, "--output-dir", str(out), "--bf16", "false"])
    err = capsys.readouterr().err
    assert status == 65  # a data error
    assert f"poisoned.jsonl:2: field transitions[0].{name}[1]" in err
    assert not (out / "final").exists()  # positive logprobs once trained to loss 0 and saved
    written = {p.name for p in out.iterdir()} if out.exists() else set()
    assert written <= {MARKER}
