"""Online training with the planner on a vLLM-shaped stand-in server, LoRA pushed over HTTP."""

from __future__ import annotations

import importlib.util
import itertools
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from lora_server_stand_in import StandInLoraServer
from peft import LoraConfig, get_peft_model
from stand_in_server import Reply, stand_in_server
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from fakes import FakeChatModel
from flowlearn.cli import main
from flowlearn.engine.server import ServerPolicy
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context, build_agentflow
from flowlearn.training import TrajectoryStore
from flowlearn.training.config import FlowGRPOConfig, parse_config
from flowlearn.training.trainer import FlowGRPOTrainer
from flowlearn.training.vllm.lora_server import (
    ServerGeneration,
    adapter_name,
)


def lora(model: Any) -> Any:
    adapter = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, adapter)


@pytest.fixture
def vllm(tiny_model_dir: Path) -> StandInLoraServer:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    served = StandInLoraServer(base, AutoTokenizer.from_pretrained(tiny_model_dir))
    yield served
    served.close()


@pytest.mark.slow
def test_server_training_two_steps_push_each_adapter_and_sample_from_it(
    tiny_model_dir: Path, tmp_path: Path, vllm: StandInLoraServer
) -> None:
    out = tmp_path / "out"
    with stand_in_server(vllm) as server:
        flags = [
            *("--planner", str(tiny_model_dir), "--benchmark", "gameof24", "--limit", "2"),
            *("--num_generations", "2", "--questions-per-step", "1", "--max-turns", "1"),
            *("--max_completion_length", "8", "--engine-max-new-tokens", "8"),
            *("--max-steps", "2", "--engine", "base", "--learning_rate", "0.01"),
            *("--bf16", "false", "--output-dir", str(out), "--planner_url", f"{server.url}/v1"),
        ]
        assert main(["train", *flags]) == 0
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    names = [adapter_name(run_id, 0), adapter_name(run_id, 1)]
    assert [load.name for load in vllm.loads] == names
    for load in vllm.loads:  # the folder the server was told of held the adapter then
        assert Path(load.path) == (out / "adapters" / load.name).resolve()
        assert {"adapter_config.json", "adapter_model.safetensors"} <= set(load.files)
    # Step k's completions name step k's adapter, and none come before it was loaded.
    completions = [e for e in vllm.events if e.startswith("complete:")]
    assert completions and vllm.events[0] == f"load:{names[0]}"
    second = vllm.events.index(f"load:{names[1]}")
    assert set(vllm.events[1:second]) == {f"complete:{names[0]}"}
    assert set(vllm.events[second + 1 :]) == {f"complete:{names[1]}"}
    versions: dict[str, set[str]] = defaultdict(set)
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        rollout = json.loads(line)
        for call in rollout["transitions"]:
            if call["node"] == "planner":
                versions[rollout["trajectory_id"].split(":")[0]].add(call["policy_version"])
    assert dict(versions) == {"step0": {names[0]}, "step1": {names[1]}}
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["flow/stale_rows"] for r in records] == [0.0, 0.0]


def test_server_training_refuses_a_server_without_runtime_lora(
    tiny_model_dir: Path,
    tmp_path: Path,
    vllm: StandInLoraServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    vllm.load_reply = Reply(404, {"detail": "Not Found"})  # VLLM_ALLOW_RUNTIME_LORA_UPDATING unset
    with stand_in_server(vllm) as server:
        flags = [
            *("--planner", str(tiny_model_dir), "--benchmark", "gameof24", "--limit", "2"),
            *("--num_generations", "2", "--questions-per-step", "1", "--max-turns", "1"),
            *("--max_completion_length", "8", "--max-steps", "1", "--bf16", "false"),
            *("--output-dir", str(tmp_path / "out"), "--planner-url", f"{server.url}/v1"),
        ]
        assert main(["train", *flags]) == 69  # a model error: the server cannot take adapters
    said = capsys.readouterr().err
    assert "flowlearn train: model error: the planner server" in said
    assert "refused to load LoRA adapter 'flow-" in said and "HTTP 404" in said
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True" in said and "--enable-lora" in said
    assert vllm.models_named == []  # no rollout ran on an adapter that is not there


@tool
def lookup(query: str) -> str:
    """Look up a fact."""
    return "paris"


def engine() -> FakeChatModel:
    def respond(messages: Any, tools: list[dict[str, Any]]) -> Any:
        if tools:
            return AIMessage(
                content="", tool_calls=[{"name": "lookup", "args": {"query": "q"}, "id": "1"}]
            )
        return "Conclusion: STOP <answer>paris</answer>"

    return FakeChatModel(respond=respond)


def test_server_training_corrects_rows_an_older_version_sampled(
    tiny_model_dir: Path, tmp_path: Path, vllm: StandInLoraServer
) -> None:
    # The graph plans on the server's base model, never on the pushed adapter: every row is
    # stale. At step 1 the trained weights are still the base (LoRA starts at zero), so the
    # rows' importance weight is 1 (as both forwards are fp32).
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    counts: dict[str, Iterator[int]] = defaultdict(itertools.count)

    def alternating(answer: str, case: Case) -> Score:  # every group has a signal: 1, 0, ...
        return Score(float(next(counts[case.id]) % 2 == 0), "alternating")

    with stand_in_server(vllm) as server:
        url = f"{server.url}/v1"
        planner = ServerPolicy(url, "base", tokenizer=tokenizer, api_key_env=None, version="base")
        args = GRPOConfig(
            output_dir=str(tmp_path / "out"),
            per_device_train_batch_size=4,
            num_generations=2,
            steps_per_generation=1,
            max_steps=2,
            learning_rate=3e-2,
            temperature=0.7,
            loss_type="dapo",
            beta=0.0,
            max_completion_length=8,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            gradient_checkpointing=False,
            use_cpu=True,
            bf16=False,
        )
        trainer = FlowGRPOTrainer.online(
            lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir)),
            args=args,
            graph_factory=lambda live: build_agentflow(planner, engine(), [lookup]),
            scorer=alternating,
            cases=[Case(str(i), f"Capital {i}?", "paris") for i in range(2)],
            context=Context(max_turns=1, planner_temperature=0.7, planner_max_new_tokens=8),
            processing_class=tokenizer,
            rollout_store=TrajectoryStore(tmp_path / "rollouts.jsonl"),
            server=ServerGeneration.at(url, tmp_path / "adapters"),
        )
        trainer.train()
        planner.close()
    logged = [h for h in trainer.state.log_history if "flow/stale_rows" in h]
    assert [h["flow/stale_rows"] for h in logged] == [4.0, 4.0]  # 2 questions x G=2, 1 turn
    assert logged[0]["flow/stale_is_ratio"] == pytest.approx(1.0, abs=1e-5)
    # At step 2 the trainer's weights have moved off the base: the weight is no longer 1 (the
    # move's size varies with the unseeded samples: 6e-4 to a few 1e-2 measured).
    assert abs(logged[1]["flow/stale_is_ratio"] - 1.0) > 1e-4
    assert len(vllm.loads) == 2 and set(vllm.models_named) == {"base"}


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--planner_url", "http://h:8000/v1", "--lora", "false"], "needs lora on.*use_vllm"),
        (["--planner_url", "h:8000/v1"], "planner_url must be the server's OpenAI base URL"),
        (["--planner_url", "http://h:8000/v1", "--top_p", "0.9"], "top_p 0.9.*set top_p 1"),
        (["--adapter_dir", "/shared/adapters"], "without planner_url nothing is written"),
        (
            ["--planner_url", "http://h:8000/v1", "--vllm_importance_sampling_mode", "tok"],
            "vllm_importance_sampling_mode must be one of",
        ),
    ],
)
def test_server_training_refuses_contradictory_options(flags: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_config(["--benchmark", "gameof24", *flags])


def test_server_training_options_from_yaml_flags_and_help(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ValueError, match="offline training"):
        FlowGRPOConfig(trajectories="t.jsonl", planner_url="http://h:8000/v1")
    (tmp_path / "c.yaml").write_text(
        "benchmark: gameof24\nplanner_url: http://h:8000/v1\nadapter_dir: /shared/adapters\n"
    )
    config = parse_config(["--config", str(tmp_path / "c.yaml")])
    assert (config.planner_url, config.adapter_dir, config.lora) == (
        "http://h:8000/v1",
        "/shared/adapters",
        True,  # unset lora is on: the server gets adapters
    )
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    shown = capsys.readouterr().out
    assert "--planner_url" in shown and "--adapter_dir" in shown and "load_lora_adapter" in shown


def load_bench() -> Any:
    path = Path(__file__).parents[2] / "bench" / "vllm_rollouts.py"
    spec = importlib.util.spec_from_file_location("vllm_rollouts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # 4 pairs of runs against the stand-in server
def test_vllm_rollouts_bench_measures_flows_against_raw_generation(
    tiny_model_dir: Path,
    tmp_path: Path,
    vllm: StandInLoraServer,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench = load_bench()
    assert bench.main(["--url", "http://h:1/v1", "--model", "m", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["tokenizer"] == "m"
    with pytest.raises(SystemExit):
        bench.main(["--url", "h:1/v1", "--model", "m", "--dry-run"])
    assert "--url must be http(s)://HOST:PORT/v1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--url", "http://h:1/v1", "--model", "m", "--repeats", "2", "--dry-run"])
    assert "--repeats must be >= 3" in capsys.readouterr().err
    out = tmp_path / "bench.json"
    with stand_in_server(vllm) as server:
        argv = ["--url", f"{server.url}/v1", "--model", "base", "--tokenizer", str(tiny_model_dir)]
        argv += ["--flows", "2", "--max-turns", "2", "--max-new-tokens", "8", "--out", str(out)]
        assert bench.main(argv) == 0
    result = json.loads(out.read_text())
    raw = [r.body for r in server.requests if r.body and r.body.get("ignore_eos")]
    flows = [r.body for r in server.requests if r.body and "ignore_eos" not in r.body]
    # a warm-up pair, then 3 in alternating order; each raw run replays the newest flows run
    runs = result["runs"]
    pairs = [("flows", "raw"), ("flows", "raw"), ("raw", "flows"), ("flows", "raw")]
    assert [r["arm"] for r in runs] == [arm for pair in pairs for arm in pair]
    for i, run in enumerate(runs):
        if run["arm"] == "raw":
            replayed = next(r for r in reversed(runs[:i]) if r["arm"] == "flows")
            assert run["tokens"] == replayed["tokens"] > 0  # the same work, as many tokens
    assert len(flows) == sum(r["calls"] for r in runs if r["arm"] == "flows")
    assert {str(b["prompt"]) for b in raw} <= {str(b["prompt"]) for b in flows}  # their prompts
    assert result["ratio"]["n"] == 3 and result["ratio"]["median"] > 0
    assert result["commit"] and result["machine"]["cpu_cores"]
    assert (
        capsys.readouterr()
        .out.strip()
        .splitlines()[-1]
        .startswith("flows_over_raw_tokens_per_second=")
    )


@pytest.mark.slow
def test_server_training_off_policy_pushes_each_version_before_naming_it(
    tiny_model_dir: Path, tmp_path: Path, vllm: StandInLoraServer
) -> None:
    out = tmp_path / "out"
    with stand_in_server(vllm) as server:
        flags = [
            *("--planner", str(tiny_model_dir), "--benchmark", "gameof24", "--limit", "3"),
            *("--num_generations", "2", "--questions-per-step", "1", "--max-turns", "1"),
            *("--max_completion_length", "8", "--engine-max-new-tokens", "8"),
            *("--max-steps", "3", "--learning_rate", "0.01", "--max_staleness", "1"),
            *("--bf16", "false", "--output-dir", str(out), "--planner_url", f"{server.url}/v1"),
        ]
        assert main(["train", *flags]) == 0
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    names = [adapter_name(run_id, k) for k in range(3)]
    assert [load.name for load in vllm.loads] == names  # none after the last update
    for k, name in enumerate(names):  # no completion names an adapter before it was loaded
        loaded = vllm.events.index(f"load:{name}")
        assert f"complete:{name}" not in vllm.events[:loaded], k
    versions: dict[str, set[str]] = defaultdict(set)
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        rollout = json.loads(line)
        for call in rollout["transitions"]:
            if call["node"] == "planner":
                versions[rollout["trajectory_id"].split(":")[0]].add(call["policy_version"])
    # step 1 was sampled under step 0's adapter while update 1 ran; step 2 under 1's or 2's
    assert versions["step0"] == {names[0]} and versions["step1"] == {names[0]}
    assert versions["step2"] in ({names[1]}, {names[2]})
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["flow/staleness"] for r in records][:2] == [0.0, 1.0]
    assert records[1]["flow/stale_rows"] == 2.0  # 1 question x G=2, 1 turn, importance-corrected
    assert all(r["flow/row_staleness_max"] <= 1 for r in records)
