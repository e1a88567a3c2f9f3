"""Red-team attacks on saved results: their base, their adapters, checkpoints and settings files."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

import torch
from peft import LoraConfig
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from flowlearn.cli import main
from flowlearn.engine.loading import check_adapter_fits
from flowlearn.engine.saved_adapters import (
    ADAPTERS_RECORD,
    read_adapters_record,
    write_adapters_record,
)
from flowlearn.errors import DataError, SavedModelError
from flowlearn.training.roles import with_node_adapters

NODES = ("planner", "verifier")
RUN = ["--max-turns", "1", "--max-new-tokens", "4", "--engine-max-new-tokens", "4"]
REPO = Path(__file__).resolve().parents[2]


def save_result(base: Path, folder: Path, record_base: str | None = None, r: int = 4) -> Path:
    """Save a planner and a verifier adapter on `base` in `folder`, recorded as training does."""
    model = AutoModelForCausalLM.from_pretrained(base)
    settings = LoraConfig(r=r, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    with_node_adapters(model, {n: settings for n in NODES}).save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    write_adapters_record(folder, record_base or str(base), NODES)
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny bases: two of one shape (seeds 0 and 1) and a wider one, each with a result."""
    from tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("saved")
    found = {
        "base": build_tiny_model(root / "tinyrel"),
        "twin": build_tiny_model(root / "twin", seed=1),
        "wide": build_tiny_model(root / "wide", hidden_size=64),
    }
    found["result"] = save_result(found["base"], root / "result")
    found["wide_result"] = save_result(found["wide"], root / "wide_result")
    return found


def copied(models: dict[str, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A base and a result on it, copied into `tmp_path` (the record naming the copy)."""
    base = Path(shutil.copytree(models["base"], tmp_path / "tinyrel"))
    result = Path(shutil.copytree(models["result"], tmp_path / "final"))
    write_adapters_record(result, str(base), NODES)
    return base, result


def run(planner: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["run", "What is 2 + 2?", "--planner", str(planner), *RUN])
    return status, capsys.readouterr().err


# ---- 4. The base of a result is stored resolvable and checkable -------------------------------


def test_a_base_typed_relative_is_recorded_absolute_with_its_fingerprint_and_runs_from_anywhere(
    models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base, result = copied(models, tmp_path)
    monkeypatch.chdir(tmp_path)
    write_adapters_record(result, "tinyrel", NODES)  # as typed: `--planner tinyrel`
    record = json.loads((result / ADAPTERS_RECORD).read_text())
    assert record["base"] == str(base.resolve()) and record["base_kind"] == "folder"
    fingerprint = record["base_fingerprint"]
    assert fingerprint["vocab_size"] == len(AutoTokenizer.from_pretrained(base)) == 400
    assert len(fingerprint["config_sha256"]) == len(fingerprint["weights_sample_sha256"]) == 64
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "tinyrel").mkdir()  # a folder of the typed name here is never looked at
    monkeypatch.chdir(elsewhere)
    status = main(["run", "What is 2 + 2?", "--planner", str(result), *RUN])
    out = capsys.readouterr().out
    assert status == 0 and "Answer:" in out and "adapters: planner, verifier" in out


@pytest.mark.parametrize(
    ("other", "differs"),
    [
        ("twin", "(weights sample sha256 differs)"),  # same shape, other weights: was exit 0
        ("wide", "(config.json sha256, weights sample sha256 differ)"),
    ],
)
def test_another_model_in_the_bases_place_is_refused_saying_what_differs(
    models: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    other: str,
    differs: str,
) -> None:
    base, result = copied(models, tmp_path)
    shutil.rmtree(base)
    shutil.copytree(models[other], base)
    status, err = run(result, capsys)
    assert status == 2, err
    assert f"the adapters in {result} were trained on base {base} (vocab 400, " in err
    assert f"{base} now has vocab 400, config.json sha256 " in err
    assert f"another model {differs}" in err
    assert f'edit "base" in {result / ADAPTERS_RECORD}' in err and "Traceback" not in err


def test_a_base_that_is_gone_is_named_as_gone(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, result = copied(models, tmp_path)
    shutil.rmtree(base)  # a temporary folder, deleted at exit
    status, err = run(result, capsys)
    assert status == 2
    assert (
        f"the base model {base} that the adapters in {result} were trained on is not there" in err
    )
    assert "huggingface.co" not in err  # the misleading hub error it used to end in


def test_an_older_record_without_a_fingerprint(
    models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Relative and present here: refused (it may be another model); absolute: a warning."""
    base, result = copied(models, tmp_path)
    older = result / ADAPTERS_RECORD
    monkeypatch.chdir(tmp_path)
    older.write_text(json.dumps({"base": "tinyrel", "nodes": list(NODES)}))
    with pytest.raises(SavedModelError) as refused:
        read_adapters_record(result)
    assert "written by an older flowlearn) names its base as typed, 'tinyrel'" in str(refused.value)
    assert f'edit "base" in {older} to the absolute path' in str(refused.value)
    older.write_text(json.dumps({"base": str(base), "nodes": list(NODES)}))
    with caplog.at_level(logging.WARNING):
        loaded = read_adapters_record(result)
    assert loaded is not None and loaded[0] == str(base)
    assert "written by an older flowlearn: its base" in caplog.text
    shutil.rmtree(base)
    with pytest.raises(SavedModelError, match="is not there any more"):
        read_adapters_record(result)


@pytest.mark.slow
def test_the_trained_graph_example_keeps_its_temporary_base_beside_the_adapters(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    script = REPO / "examples" / "train_your_graph.py"
    subprocess.run(
        [sys.executable, str(script), "--output-dir", str(out), "--steps", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    loaded = read_adapters_record(out / "final")  # after the temporary folder is gone
    assert loaded is not None
    base, folders = loaded
    assert base == str(out / "base-model") and (out / "base-model" / "config.json").is_file()
    assert sorted(folders) == ["router", "writer"]
    record = json.loads((out / "final" / ADAPTERS_RECORD).read_text())
    assert record["base_fingerprint"]["weights_sample_sha256"]


# ---- 5. An adapter's size is bounded by its base's shapes, before it is allocated ------------


CHILD = """
import resource, sys
limit = 4 << 30  # the attack asked for 5 GB per layer; a run of the tiny model peaks at 0.5 GB
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from flowlearn.cli import main
status = main(sys.argv[1:])
# VmHWM, this process's own peak: ru_maxrss keeps the parent's peak across fork and exec
peak = next(l for l in open("/proc/self/status") if l.startswith("VmHWM:")).split()[1]
print("peak_rss_kb", peak, file=sys.stderr)
sys.exit(status)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["result", "adapter folder"])
def test_an_edited_huge_rank_is_refused_fast_with_bounded_memory(
    models: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    _, result = copied(models, tmp_path)
    folder = result / "planner"
    if kind == "adapter folder":  # `--planner FOLDER`: transformers loads base and adapter
        AutoTokenizer.from_pretrained(models["base"]).save_pretrained(folder)
    settings = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**settings, "r": 20_000_000}))
    planner = result if kind == "result" else folder
    done = subprocess.run(
        [sys.executable, "-c", CHILD, "run", "What is 2 + 2?", "--planner", str(planner), *RUN],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode in (2, 69), done.stderr  # a usage error, or a model error
    assert "asks for rank 20000000 on model.layers.0.self_attn.q_proj, a 32 x 32 weight" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    peak = int(done.stderr.split("peak_rss_kb")[1].split()[0]) * 1024
    assert peak < 1.5e9  # 20M x (32 + 32) x 4 bytes would be 5.1 GB for its first layer alone


def test_an_adapter_is_bounded_by_each_layer_and_by_the_base_as_a_whole(
    models: dict[str, Path], tmp_path: Path
) -> None:
    with torch.device("meta"):  # shapes only, as `flowlearn run` checks an adapter folder
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(models["base"]))
    folder = tmp_path / "adapter"
    folder.mkdir()
    good = json.loads((models["result"] / "planner" / "adapter_config.json").read_text())

    def check(**changes: Any) -> None:
        (folder / "adapter_config.json").write_text(json.dumps({**good, **changes}))
        check_adapter_fits(folder, base, node="planner")

    check()  # the saved one fits
    with pytest.raises(SavedModelError, match=r"rank 17 on model.layers.0.self_attn.k_proj, a 16"):
        check(r=17)  # k_proj is 32 -> 16 (grouped-query attention)
    with pytest.raises(SavedModelError, match=r"asks for rank 64 on model\.layers\.0\.mlp\.down"):
        check(rank_pattern={"down_proj": 64})
    # every layer at its largest rank, the embedding too: each in bounds, together 1.4 x the base
    full = {"r": 32, "rank_pattern": {"k_proj": 16, "v_proj": 16}}
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    with pytest.raises(SavedModelError, match=r"would hold 4\d,\d{3} weights, more than its base"):
        check(**full, target_modules=[*targets, "embed_tokens"])
    for changes, says in [
        ({"peft_type": "LOHA"}, "is not a LoRA adapter (peft_type 'LOHA')"),
        ({"r": "8"}, "rank '8' is not a whole number from 1"),
        ({"r": True}, "rank True is not a whole number from 1"),
        ({"layer_replication": [[0, 2]] * 1000}, "sets layer_replication"),
    ]:
        with pytest.raises(SavedModelError, match=says.replace("(", r"\(").replace(")", r"\)")):
            check(**changes)


# ---- 6. Clear errors, not tracebacks -----------------------------------------------------------


@pytest.mark.parametrize("file", [ADAPTERS_RECORD, "planner/adapter_config.json"])
def test_a_200k_deep_json_file_is_a_clear_error(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], file: str
) -> None:
    _, result = copied(models, tmp_path)
    (result / file).write_text("[" * 200_000 + "]" * 200_000)  # json.loads: RecursionError
    status, err = run(result, capsys)
    assert status in (2, 69) and f"{result / file} nests too deep" in err
    assert "RecursionError" not in err


def test_an_adapter_of_a_model_of_another_size_is_a_clear_error_in_run(
    models: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, result = copied(models, tmp_path)
    for file in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy(models["wide_result"] / "planner" / file, result / "planner" / file)
    status, err = run(result, capsys)
    assert status in (2, 69)  # a usage error, or a model error
    assert (
        f"the planner adapter in {result / 'planner'} was trained on a model of another size" in err
    )
    assert "this base needs [4, 64]" in err and "size mismatch" not in err


def test_a_node_checkpoint_of_another_size_is_refused_before_loading(
    models: dict[str, Path], tmp_path: Path
) -> None:
    from flowlearn.training.model import check_checkpoint

    checkpoint = tmp_path / "checkpoint-1"
    shutil.copytree(models["wide_result"], checkpoint)  # planner/ and verifier/, as saved
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    model = AutoModelForCausalLM.from_pretrained(models["base"])
    live = with_node_adapters(model, {n: settings for n in NODES})
    with pytest.raises(SavedModelError, match=r"lora_A.weight in adapter_model.safetensors is \[4"):
        check_checkpoint(checkpoint, live)
    wide = AutoModelForCausalLM.from_pretrained(models["wide"])
    check_checkpoint(checkpoint, with_node_adapters(wide, {n: settings for n in NODES}))


class Planted:
    """A pickled object whose loading would create a file: proof that nothing ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


@pytest.fixture(scope="module")
def trained(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An offline training run of one step on the tiny base, with its checkpoint-1."""
    pytest.importorskip("trl")
    from offline_setup import sampled

    from flowlearn.engine.local import HFPolicy
    from flowlearn.training.trajectories import TrajectoryStore

    root = tmp_path_factory.mktemp("trained")
    model = AutoModelForCausalLM.from_pretrained(models["base"])
    store = TrajectoryStore(root / "t.jsonl")
    for trajectory in sampled(HFPolicy(model, AutoTokenizer.from_pretrained(models["base"]))):
        store.append(trajectory)
    assert main([*train_flags(models["base"], root), "--max_steps", "1"]) == 0
    assert (root / "out" / "checkpoint-1" / "optimizer.pt").is_file()
    return root


def train_flags(base: Path, root: Path) -> list[str]:
    return [
        "train", "--planner", str(base), "--trajectories", str(root / "t.jsonl"),
        "--output-dir", str(root / "out"), "--save_steps", "1", "--bf16", "false",
        "--num_generations", "2", "--questions_per_step", "2", "--max_completion_length", "12",
    ]  # fmt: skip


def test_resume_from_a_checkpoint_holding_pickles_is_refused_without_torchs_hint(
    models: dict[str, Path], trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = Path(shutil.copytree(trained, tmp_path / "copy"))
    optimizer = root / "out" / "checkpoint-1" / "optimizer.pt"
    marker = tmp_path / "unpickled"
    torch.save({"state": Planted(marker)}, optimizer)
    capsys.readouterr()
    status = main([*train_flags(models["base"], root), "--max_steps", "2", "--resume"])
    err = capsys.readouterr().err
    assert status == 69  # a model error
    assert f"checkpoint file {optimizer} holds pickled Python objects" in err
    assert "Unsupported global: GLOBAL getattr" in err
    for hint in ("weights_only", "Re-running", "add_safe_globals", "Traceback"):
        assert hint not in err
    assert not marker.exists() and not (root / "out" / "checkpoint-2").exists()


def test_resume_with_a_model_of_another_size_is_a_clear_error(
    models: dict[str, Path], trained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = Path(shutil.copytree(trained, tmp_path / "copy"))
    capsys.readouterr()
    status = main([*train_flags(models["wide"], root), "--max_steps", "2", "--resume"])
    err = capsys.readouterr().err
    assert status == 69  # a model error
    assert "holds weights of a model of another size: model.embed_tokens.weight in " in err
    assert "is [400, 32], the model being trained has [400, 64]" in err
    assert "size mismatch" not in err and not (root / "out" / "checkpoint-2").exists()


@pytest.mark.parametrize("field", ["reward", "reward_terms"])
@pytest.mark.parametrize("value", [1e308, -1e308])
def test_a_finite_but_huge_reward_is_refused_naming_file_and_line(
    tmp_path: Path, field: str, value: float
) -> None:
    """1e308 passes `isfinite`, and a group's spread of it overflows to inf (NaN advantages)."""
    from flowlearn.training.trajectories import Trajectory, TrajectoryStore

    assert not torch.isfinite(torch.tensor([value, 0.0], dtype=torch.float64).std())
    good = Trajectory("g/0", "g", "q", "r", "a", "a", 1.0)
    terms = {"length": value} if field == "reward_terms" else {}
    bad = dataclasses.replace(good, trajectory_id="g/1", reward_terms=terms)
    record = bad.to_dict() | ({"reward": value} if field == "reward" else {})
    path = tmp_path / "t.jsonl"
    path.write_text(good.to_json() + "\n" + json.dumps(record) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"t\.jsonl:2: field reward.* is not a finite number"):
        TrajectoryStore(path).load()
    with pytest.raises(DataError, match=r"within ±1e\+06"):  # nor is one appended
        TrajectoryStore(tmp_path / "new.jsonl").append(Trajectory.from_dict(record))


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('learning_rate: !!python/object/apply:os.system ["echo hi"]\n', "line 1 has the tag"),
        ("? [a, b]\n: 1\n", "line 1 has a key that is a list or mapping"),
        ("seed: 1\n? {x: 1}\n: 2\n", "line 2 has a key that is a list or mapping"),
        ("max_steps: !custom 5\n", "line 1 has the tag '!custom'"),
    ],
)
def test_yaml_with_a_python_tag_or_a_complex_key_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    pytest.importorskip("trl")
    config = tmp_path / "config.yaml"
    config.write_text(text)
    assert main(["train", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"--config {config}: {says}" in err and "ConstructorError" not in err


@pytest.mark.parametrize("content", [b"hello, not a database\n", os.urandom(4096)])
def test_checkpoints_that_are_not_a_database_are_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes
) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    argv = ["run", "What is 2 + 2?", "--thread", "t", "--checkpoints", str(path)]
    assert main([*argv, "--planner", str(tmp_path / "none")]) == 2
    assert f"--checkpoints {path} is not a SQLite database" in capsys.readouterr().err
    assert path.read_bytes() == content
