from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

import torch

from flowlearn.cli import main
from flowlearn.training.config import FlowGRPOConfig, parse_config


def test_config_rejects_unknown_and_contradictory_keys(tmp_path: Path) -> None:
    (tmp_path / "typo.yaml").write_text("benchmark: gameof24\nlearning_rat: 1.0e-5\n")
    with pytest.raises(ValueError, match=r"unknown config keys \['learning_rat'\]"):
        parse_config(["--config", str(tmp_path / "typo.yaml")])
    with pytest.raises(ValueError, match="exclude each other"):
        FlowGRPOConfig(benchmark="gameof24", trajectories="t.jsonl")
    with pytest.raises(ValueError, match=r"one of benchmark or data \(or trajectories\), not both"):
        FlowGRPOConfig(benchmark="gameof24", data="cases.jsonl")
    with pytest.raises(ValueError, match=r"give one of benchmark or data \(or trajectories\): the"):
        FlowGRPOConfig().check_questions_named()  # Python's train_dataset is the other way
    assert main(["train", "--max-steps", "1"]) == 2  # the CLI has no other way: a usage error
    with pytest.raises(ValueError, match="needs lora on"):
        FlowGRPOConfig(benchmark="gameof24", engine="base", lora=False)
    with pytest.raises(ValueError, match="group_size is now num_generations"):
        parse_config(["--benchmark", "gameof24", "--group-size", "4"])


def test_yaml_and_flags_fill_trls_own_fields(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(
        "benchmark: gameof24\nnum_generations: 4\nlearning_rate: 1e-6\nmax_steps: 9\n"
        "tools: [python, local_search]\ntemperature: 0.5\nmax_completion_length: 64\n"
    )
    config = parse_config(["--config", str(tmp_path / "c.yaml"), "--max-steps", "5", "--lora"])
    assert isinstance(config.learning_rate, float) and config.learning_rate == 1e-6
    assert (config.num_generations, config.max_steps, config.lora) == (4, 5, True)  # flags win
    assert config.per_device_train_batch_size == 4 * 4  # questions_per_step x G
    assert config.gradient_accumulation_steps == config.steps_per_generation == 1
    assert config.loss_type == "dapo"
    assert config.use_cpu == (not torch.cuda.is_available())  # use_cpu follows the device
    context = config.context()  # the planner samples with TRL's settings
    assert (context.planner_temperature, context.planner_max_new_tokens) == (0.5, 64)
    assert context.tools == ("python", "local_search") and context.max_turns == 3
    assert context.query_analysis is None  # the prompt set's choice
    with_analysis = parse_config(["--config", str(tmp_path / "c.yaml"), "--query_analysis"])
    assert with_analysis.context().query_analysis is True  # a bare flag, as a YAML `true`
    (tmp_path / "bad.yaml").write_text("benchmark: gameof24\nquery_analysis: maybe\n")
    with pytest.raises(ValueError, match=r"query_analysis.*got maybe"):
        parse_config(["--config", str(tmp_path / "bad.yaml")])


def test_the_kl_is_the_papers_plain_k3_unless_asked() -> None:
    assert parse_config(["--benchmark", "gameof24"]).use_bias_correction_kl is False
    flipped = parse_config(["--benchmark", "gameof24", "--use_bias_correction_kl", "true"])
    assert flipped.use_bias_correction_kl is True
    assert FlowGRPOConfig(benchmark="gameof24").use_bias_correction_kl is False


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("gradient_accumulation_steps", "3"),  # 4 x 8 rollouts a step: not 3 micro-steps
        ("steps_per_generation", "3"),
        ("per_device_train_batch_size", "3"),
        ("per_device_train_batch_size", "8"),  # 4 micro-steps: accumulation or 4 updates?
        ("loss_type", "grpo"),
        ("top_k", "5"),
    ],
)
def test_trl_options_the_trainer_cannot_honour_are_errors(option: str, value: str) -> None:
    with pytest.raises(ValueError, match=option):
        parse_config(["--benchmark", "gameof24", f"--{option}", value])


def test_train_help_lists_trls_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["train", "--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for option in (
        "--gradient_accumulation_steps",
        "--use_bias_correction_kl",
        "--disable_dropout",
        "--num_generations",
        "--questions_per_step",
    ):
        assert option in shown, option


def test_train_cli_errors_are_clear(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "c.yaml").write_text("benchmark: gameof24\nbogus: 1\n")
    assert main(["train", "--config", str(tmp_path / "c.yaml")]) == 2
    assert "unknown config keys ['bogus']" in capsys.readouterr().err
    assert main(["train", "--benchmark", "gameof24", "--num-generations", "0"]) == 2
    assert "num_generations must be in [1, 1024]" in capsys.readouterr().err
    assert main(["train", "--benchmark", "gameof24", "--max_steps", "many"]) == 2
    assert "invalid int value: 'many'" in capsys.readouterr().err


def questions_per_step(out: Path) -> dict[str, list[str]]:
    steps: dict[str, list[str]] = {}
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        steps.setdefault(row["trajectory_id"].split(":")[0], []).append(row["group_id"])
    return {step: sorted(set(groups)) for step, groups in steps.items()}


def test_lora_with_the_frozen_base_as_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "lora"
    assert (
        main(
            [
                "train",
                "--planner",
                str(tiny_model_dir),
                "--benchmark",
                "gameof24",
                "--limit",
                "2",
                "--num_generations",
                "2",
                "--questions-per-step",
                "1",
                "--max-turns",
                "1",
                "--max_completion_length",
                "8",
                "--engine-max-new-tokens",
                "8",
                "--max-steps",
                "1",
                "--lora",
                "--engine",
                "base",
                "--beta",
                "0.01",
                "--bf16",
                "false",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    assert (out / "final-adapter" / "adapter_config.json").exists()
    assert (out / "final" / "config.json").exists()
    rollout = json.loads((out / "rollouts.jsonl").read_text().splitlines()[0])
    assert rollout["transitions"][-1]["node"] == "generator"


@pytest.mark.slow
def test_train_checkpoint_resume_and_final_policy_runs(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "train"
    config = tmp_path / "train.yaml"
    config.write_text(
        f"planner: {tiny_model_dir}\nbenchmark: gameof24\nlimit: 4\nnum_generations: 2\n"
        f"questions_per_step: 1\nmax_turns: 1\nmax_completion_length: 8\n"
        f"engine_max_new_tokens: 8\nlearning_rate: 0.001\nsave_steps: 1\nmax_steps: 2\n"
        f"output_dir: {out}\nbf16: false\n"
    )
    assert main(["train", "--config", str(config)]) == 0
    assert (out / "checkpoint-2").is_dir() and (out / "final" / "config.json").exists()
    trained_under = json.loads((out / "final" / "flowlearn_prompts.json").read_text())
    # a model of one's own: AgentFlow's flow; the engine it trained against is kept
    assert trained_under == {"prompts": "agentflow", "engine": str(tiny_model_dir)}
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2
    card = (out / "README.md").read_text()  # ours, not TRL's GRPO card with a made-up link
    assert "Flow-GRPO" in card and f"`{tiny_model_dir}`" in card and "huggingface.co" not in card
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    capsys.readouterr()
    assert main(["train", "--config", str(config)]) == 2  # a fresh run over stored rollouts
    assert "pass --resume to continue that run" in capsys.readouterr().err
    assert main(["train", "--config", str(config), "--max-steps", "3", "--resume"]) == 0
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert json.loads((out / "run.json").read_text())["run_id"] == run_id  # kept on resume
    ids = [json.loads(line)["trajectory_id"] for line in (out / "rollouts.jsonl").open()]
    assert len(ids) == 3 * 2 and all(i.endswith(f"@{run_id}") for i in ids)
    # The resumed run kept the data order: step by step, the same questions as a straight run.
    straight = tmp_path / "straight"
    assert (
        main(["train", "--config", str(config), "--max-steps", "3", "--output-dir", str(straight)])
        == 0
    )
    assert questions_per_step(out) == questions_per_step(straight)
    assert sorted(questions_per_step(out)) == ["step0", "step1", "step2"]
    capsys.readouterr()
    assert (
        main(
            [
                "run",
                "What is 2 + 2?",
                "--planner",
                str(out / "final"),
                "--max-turns",
                "1",
                "--max-new-tokens",
                "8",
                "--engine-max-new-tokens",
                "8",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "Answer:" in printed and "prompts: agentflow" in printed
    assert f"engine: the one {out / 'final'} was trained against" in printed


@pytest.mark.parametrize(
    ("yaml_line", "message"),
    [
        ("tools: [python, pyhton]", "unknown tools ['pyhton']"),
        ("benchmark: gameof42", "unknown benchmark 'gameof42'"),
        ("corpus: /nonexistent/corpus.jsonl", "is not a file"),
        ("planner: /nonexistent/model", "model '/nonexistent/model' does not exist"),
    ],
)
def test_training_names_are_checked_by_the_root_before_any_model_loads(
    tmp_path: Path, yaml_line: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text('{"id": "a", "query": "1 + 1?", "reference": "2"}\n')
    data = "" if yaml_line.startswith("benchmark") else f"data: {cases}\n"
    config = tmp_path / "train.yaml"
    config.write_text(f"{data}{yaml_line}\noutput_dir: {tmp_path / 'out'}\n")
    assert main(["train", "--config", str(config)]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing started


def test_the_live_planner_and_the_frozen_base_share_one_model_lock(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from flowlearn.compose import build_training_parts
    from flowlearn.training.trainer import FlowGRPOTrainer

    flags = ["--planner", str(tiny_model_dir), "--benchmark", "gameof24", "--limit", "2"]
    flags += ["--num_generations", "2", "--questions-per-step", "1", "--max-turns", "1"]
    flags += ["--max_completion_length", "4", "--engine-max-new-tokens", "4", "--lora"]
    flags += ["--engine", "base", "--bf16", "false", "--use_cpu", "true"]
    config = parse_config([*flags, "--output_dir", str(tmp_path / "out"), "--report_to", "none"])
    parts = build_training_parts(config)
    assert parts.handle is not None and parts.engine is not None
    assert parts.engine.policy.handle is parts.handle  # type: ignore[attr-defined]
    trainer = FlowGRPOTrainer.online(
        parts.model,
        args=config,
        cases=parts.cases or [],
        scorer=parts.scorer,  # type: ignore[arg-type]
        engine=parts.engine,
        tools=parts.tools,
        handle=parts.handle,
        processing_class=parts.tokenizer,
    )
    trainer.rollout((parts.cases or [])[:1])
    assert trainer.model_handle is parts.handle


def test_a_config_files_data_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "c.yaml").write_text(
        f"data: cases.jsonl\ncorpus: ../corpus.jsonl\ntrajectories: null\n"
        f"output_dir: {tmp_path / 'out'}\n"
    )
    config = parse_config(["--config", str(folder / "c.yaml")])
    assert Path(config.data) == folder / "cases.jsonl"
    assert Path(config.corpus) == folder / ".." / "corpus.jsonl"
    flags = parse_config(["--config", str(folder / "c.yaml"), "--data", "mine.jsonl"])
    assert flags.data == "mine.jsonl"  # a flag is relative to the working folder, as typed
    (folder / "abs.yaml").write_text(f"data: {tmp_path / 'x.jsonl'}\n")
    assert parse_config(["--config", str(folder / "abs.yaml")]).data == str(tmp_path / "x.jsonl")
