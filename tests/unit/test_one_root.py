"""One root, one declaration: TRL's shape builds on the CLI's composition root, and the rollout
settings' defaults are declared once (`TRAINING_CONTEXT`) for the config, the CLI and `Context`."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from fakes import FakeChatModel
from flowlearn.cli import build_parser
from flowlearn.compose import FlowSpec, build_tools
from flowlearn.flow_setup import CONTEXT_FLAGS
from flowlearn.nodes.schema.context import TRAINING_CONTEXT, Context

ROLLOUT_FIELDS = {  # FlowGRPOConfig's field -> the Context field it is
    "max_turns": "max_turns",
    "temperature": "planner_temperature",
    "top_p": "planner_top_p",
    "max_completion_length": "planner_max_new_tokens",
    "tools": "tools",
    "query_analysis": "query_analysis",
}


def cli_defaults(*argv: str) -> dict[str, Any]:
    args = build_parser().parse_args(list(argv))
    return {name: getattr(args, name) for name in CONTEXT_FLAGS}


def test_run_and_eval_flags_default_to_the_context() -> None:
    inference = {name: getattr(Context(), name) for name in CONTEXT_FLAGS}
    assert cli_defaults("run", "What is 2 + 2?") == inference
    assert cli_defaults("eval", "--benchmark", "gameof24") == inference


def collect_defaults() -> dict[str, Any]:
    return cli_defaults("collect", "--benchmark", "gameof24", "--out", "r.jsonl")


def test_collect_flags_default_to_the_training_context() -> None:
    training = {name: getattr(TRAINING_CONTEXT, name) for name in CONTEXT_FLAGS}
    budget = "planner_max_new_tokens"  # see the test below
    assert {k: v for k, v in collect_defaults().items() if k != budget} == {
        k: v for k, v in training.items() if k != budget
    }
    # training differs from a run only where it says so: turns, sampling, the turn's budget
    changed = {
        f.name
        for f in dataclasses.fields(Context)
        if getattr(TRAINING_CONTEXT, f.name) != getattr(Context(), f.name)
    }
    assert changed == {"max_turns", "planner_temperature", "planner_max_new_tokens"}


def test_collected_turns_have_the_training_budget() -> None:
    budget = TRAINING_CONTEXT.planner_max_new_tokens
    assert collect_defaults()["planner_max_new_tokens"] == budget


def test_the_training_config_defaults_are_the_training_context(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.training.config import FlowGRPOConfig, context_from, parse_config

    fields = {f.name: f for f in dataclasses.fields(FlowGRPOConfig)}
    for name, context_name in ROLLOUT_FIELDS.items():
        assert fields[name].default == getattr(TRAINING_CONTEXT, context_name), name
    for name in ("max_turns", "tools", "query_analysis"):  # the help is the context's too
        description = next(f for f in dataclasses.fields(Context) if f.name == name).metadata
        assert fields[name].metadata["help"] == description["description"], name
    config = parse_config(["--output_dir", str(tmp_path / "out"), "--use_cpu", "true"])
    assert config.context() == dataclasses.replace(TRAINING_CONTEXT, seed=config.seed)
    assert context_from(config).max_turns == TRAINING_CONTEXT.max_turns


def test_the_config_names_the_roots_settings_with_its_defaults(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.compose.training import training_spec
    from flowlearn.config_keys import config_keys
    from flowlearn.training.config import FlowGRPOConfig

    spec_fields = {f.name: f.default for f in dataclasses.fields(FlowSpec)}
    config_fields = {f.name: f.default for f in dataclasses.fields(FlowGRPOConfig)}
    shared = sorted(set(spec_fields) & set(config_fields))
    assert {"web", "python_isolation", "wikipedia_endpoint", "corpus", "prompts"} <= set(shared)
    for name in shared:  # None: the root's default ("default" for the planner)
        assert config_fields[name] in (None, spec_fields[name]), name
    assert {"web", "python_isolation", "wikipedia_endpoint"} <= (config_keys() or set())
    config = FlowGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        web=True,
        python_isolation="none",
        wikipedia_endpoint="http://127.0.0.1:9/w/api.php",
    )
    spec = training_spec(config)
    assert (spec.web, spec.python_isolation, spec.wikipedia_endpoint) == (
        True,
        "none",
        "http://127.0.0.1:9/w/api.php",
    )


def test_yaml_binds_web_tools_and_chooses_the_sandbox(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.training.config import parse_config

    file = tmp_path / "train.yaml"
    file.write_text(f"web: true\npython_isolation: none\noutput_dir: {tmp_path / 'out'}\n")
    config = parse_config(["--config", str(file), "--use_cpu", "true"])
    assert config.web is True and config.python_isolation == "none"
    file.write_text(f"python_isolation: docker\noutput_dir: {tmp_path / 'out'}\n")
    with pytest.raises(ValueError, match="python_isolation must be one of 'bwrap', 'none'"):
        parse_config(["--config", str(file), "--use_cpu", "true"])


def test_trls_shape_binds_the_tools_the_cli_binds(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("trl")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flowlearn.training.config import FlowGRPOConfig
    from flowlearn.training.from_trl import trl_parts

    monkeypatch.setenv("TAVILY_API_KEY", "not-used")  # web_search is bound, never called
    engine = FakeChatModel(text="-")
    args = FlowGRPOConfig(
        output_dir=str(tmp_path / "out"), use_cpu=True, web=True, python_isolation="none"
    )
    parts = trl_parts(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        "exact_match",
        args,
        [{"question": "A?", "answer": "a"}],
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        engine=engine,
    )
    cli = FlowSpec.from_env({}, planner=str(tiny_model_dir), web=True, python_isolation="none")
    assert parts.prompts == cli.prompt_set()
    assert [t.name for t in parts.tools] == [t.name for t in build_tools(cli, engine)]
    assert {"wikipedia_search", "web_search"} <= {t.name for t in parts.tools}
    python = next(t for t in parts.tools if t.name == "python")
    assert "sandbox" not in python.description  # isolation 'none', as asked


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"tools": ["web_search"]}, "the web tools ['wikipedia_search', 'web_search'] need web"),
        ({"web": True}, "web_search needs a Tavily API key"),
        ({"corpus": "/nonexistent/corpus.jsonl"}, "is not a file"),
        ({"engine": "/nonexistent/engine"}, "model '/nonexistent/engine' does not exist"),
        ({"train_nodes": ["planner", "generator"]}, "the generator runs the fixed engine"),
    ],
)
def test_trls_shape_and_flowlearn_train_refuse_the_same_names_before_loading(
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: dict[str, Any],
    message: str,
) -> None:
    pytest.importorskip("trl")
    from flowlearn.compose import build_training_parts
    from flowlearn.training.config import FlowGRPOConfig
    from flowlearn.training.from_trl import trl_parts

    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    out, cases = tmp_path / "out", tmp_path / "cases.jsonl"
    cases.write_text('{"id": "a", "query": "1 + 1?", "reference": "2"}\n')
    values = dict(output_dir=str(out), use_cpu=True, lora=True, **settings)
    refused = re.escape(message)
    with pytest.raises(ValueError, match=refused):
        trl_parts(str(tiny_model_dir), "exact_match", FlowGRPOConfig(**values), [{"question": "Q"}])
    assert not out.exists()  # refused before the folder is claimed or a model loads
    named = FlowGRPOConfig(**values, planner=str(tiny_model_dir), data=str(cases))
    with pytest.raises(ValueError, match=refused):
        build_training_parts(named)
