"""A quiet, quick CLI: one-line usage errors before any heavy import, libraries silenced unless
--verbose, one console line per training step; TRL's names at the top of the package."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from flowlearn.cli import COMMANDS, QUIET_ENV, library_output, main

ROOT = Path(__file__).parents[2]
HEAVY = ("torch", "transformers", "trl", "peft")
FLOW_LIBRARIES = ("langgraph", "langchain_core", "langchain", *HEAVY)
"""What the flow and the trainer load: none of it may load before the options have parsed."""
USAGE_ERRORS = [
    *([name, "--nonsense"] for name in COMMANDS),  # an unknown flag, for every subcommand
    ["run", "q", "--max-turns", "many"],  # a bad value
    ["eval", "--benchmark", "nope"],
    ["collect", "--benchmark", "gameof24"],  # a missing option (--out)
    ["serve"],  # a missing argument (the folder)
    ["run"],  # no question: told by the command, before the flow is built
    ["nope"],  # an unknown subcommand
    ["--nonsense"],
]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--nonsense"], "flowlearn train: error: unknown config keys ['nonsense']"),
        (["run", "q", "--max-stpes", "3"], "flowlearn run: error: unrecognized arguments"),
    ],
)
def test_a_usage_error_is_one_line_and_quick(argv: list[str], message: str) -> None:
    # measured on 2 loaded cores (load 4 to 7): train 0.1-0.3 s (7 s before: TRL was imported
    # first), run 0.1 s (1.0-4.2 s while its options imported LangGraph); bounded generously here
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "flowlearn", *argv], capture_output=True, text=True, check=False
    )
    seconds = time.perf_counter() - started
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), done.stderr
    assert "--help" in lines[0] and "usage:" not in done.stderr
    assert seconds < 10, seconds


@pytest.mark.parametrize("argv", USAGE_ERRORS, ids=" ".join)
def test_a_usage_error_is_told_before_the_flows_libraries_load(argv: list[str]) -> None:
    # `-X importtime` names every module the command imported, on stderr beside its message
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "flowlearn", *argv],
        capture_output=True,
        text=True,
        check=False,
    )
    imports = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    said = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert len(said) == 1 and said[0].startswith("flowlearn") and "usage:" not in said[0], said
    loaded = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in imports}
    assert "flowlearn" in loaded  # the report is read right: it names the package itself
    assert not loaded & set(FLOW_LIBRARIES), sorted(loaded & set(FLOW_LIBRARIES))


def test_a_train_usage_error_imports_neither_torch_nor_trl() -> None:
    code = (
        "import sys\nfrom flowlearn.cli import main\n"
        "assert main(['train', '--nonsense', '--learning-rate', '1e-6']) == 2\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
    assert "unknown config keys ['nonsense']" in done.stderr


def test_a_bad_value_names_the_subcommand_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["eval", "--benchmark", "nope"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("flowlearn eval: error: argument --benchmark")
    assert err[0].endswith("(see `flowlearn eval --help`)")


def test_library_output_silences_the_libraries_not_flowlearn_and_puts_things_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in QUIET_ENV:
        monkeypatch.delenv(key, raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with library_output(verbose=False):
            assert all(os.environ[key] == value for key, value in QUIET_ENV.items())
            warnings.warn_explicit("lib", FutureWarning, "x.py", 1, module="transformers.utils")
            warnings.warn_explicit("ours", UserWarning, "y.py", 1, module="flowlearn.training")
        with library_output(verbose=True):
            warnings.warn_explicit("lib, verbose", FutureWarning, "x.py", 1, module="trl.trainer")
    assert [str(w.message) for w in caught] == ["ours", "lib, verbose"]
    assert not any(key in os.environ for key in QUIET_ENV)


def test_each_step_prints_one_line_and_verbose_the_whole_dict() -> None:
    pytest.importorskip("transformers")
    from flowlearn.training.metrics import StepLines

    logs = {"loss": 0.02, "kl": 0.001, "flow/mean_reward": 0.5, "flow/accuracy": 0.5, "x": 1.0}
    state = SimpleNamespace(global_step=2, max_steps=8)
    line = StepLines(verbose=False)(logs, state)
    assert line.startswith("step 2/8  reward 0.5  accuracy 50.0%  kl 0.001  loss 0.02  ")
    assert line.endswith(" s") and "\n" not in line and "'x'" not in line
    assert StepLines(verbose=True)(logs, state) == str(
        {"loss": 0.02, "kl": 0.001, "flow/mean_reward": 0.5, "flow/accuracy": 0.5, "x": 1}
    )
    summary = StepLines(verbose=False)({"train_runtime": 61.25, "train_loss": 0.1}, state)
    assert summary == "trained 2 steps in 61.2 s"


def test_accuracy_is_logged_when_every_outcome_is_right_or_wrong() -> None:
    pytest.importorskip("transformers")
    from flowlearn.training.metrics import FLOW_STATS, flow_metrics
    from flowlearn.training.trajectories import Trajectory

    def rollout(reward: float) -> Trajectory:
        return Trajectory("t", "g", "q", "a", "a", "a", reward)

    stats = dict.fromkeys(FLOW_STATS, 0)
    values, _ = flow_metrics([rollout(1.0), rollout(0.0), rollout(1.0), rollout(1.0)], stats, 1.0)
    assert values["flow/accuracy"] == 0.75
    values, _ = flow_metrics([rollout(0.5), rollout(1.0)], stats, 1.0)
    assert "flow/accuracy" not in values  # a graded reward is no accuracy


def test_the_light_option_names_are_the_configs_fields() -> None:
    pytest.importorskip("trl")
    from flowlearn.config_keys import config_keys, unknown_flags
    from flowlearn.training.config import FlowGRPOConfig, FlowParser

    assert config_keys() == {f.name for f in dataclasses.fields(FlowGRPOConfig)}
    spelled = sorted({o for a in FlowParser()._actions for o in a.option_strings})
    assert unknown_flags(spelled) == []  # every option TRL's parser takes passes the check


def test_trls_names_at_the_top_are_the_deep_ones_and_load_lazily() -> None:
    pytest.importorskip("trl")
    from flowlearn import FlowGRPOConfig, FlowGRPOTrainer
    from flowlearn.training.config import FlowGRPOConfig as DeepConfig
    from flowlearn.training.trainer import FlowGRPOTrainer as DeepTrainer

    assert (FlowGRPOConfig, FlowGRPOTrainer) == (DeepConfig, DeepTrainer)
    code = "import sys, flowlearn; print('trl' in sys.modules, 'FlowGRPOTrainer' in dir(flowlearn))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "True"]
    with pytest.raises(AttributeError, match="no attribute 'FlowGRPOTrainers'"):
        import flowlearn

        _ = flowlearn.FlowGRPOTrainers


def test_the_learn_tools_recipe_runs_copied_anywhere(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.training.config import parse_config

    copy = tmp_path / "recipe.yaml"
    shutil.copy(ROOT / "examples" / "learn_tools.yaml", copy)
    config = parse_config(["--config", str(copy)])
    task = ROOT / "evals" / "data" / "tooluse"
    assert Path(config.data).read_bytes() == (task / "train.jsonl").read_bytes()
    assert Path(config.corpus).read_bytes() == (task / "corpus.jsonl").read_bytes()
    with pytest.raises(ValueError, match="no file shipped with flowlearn"):
        parse_config(["--config", str(copy), "--data", "flowlearn:evals/missing.jsonl"])
