from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import Context

EXAMPLES = Path(__file__).parents[2] / "examples"


def test_variant_without_verifier_runs_with_fakes() -> None:
    module = runpy.run_path(str(EXAMPLES / "planner_without_verifier.py"))
    engine = FakeChatModel(
        respond=lambda m, tools: (
            FakeChatModel(default_args={"a": 2, "b": 5})
            ._generate(m, tools=tools)
            .generations[0]
            .message
            if tools
            else "<answer>10</answer>"
        )
    )
    graph = module["build_graph"](ScriptedPolicy([plan("multiply")]), engine, [module["multiply"]])
    state = graph.invoke({"question": "2*5?"}, context=Context(max_turns=2))
    assert "verifier" not in graph.get_graph().nodes
    assert [r["kind"] for r in state["memory"]] == ["action", "action"]
    assert state["answer"] == "10" and state["termination"] == "max_turns"


def test_example_script_runs() -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "planner_without_verifier.py")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "answer: 391 | termination: max_turns" in out


@pytest.mark.parametrize(
    ("script", "line"),
    [
        ("as_tool.py", "tool: 391"),
        ("parent_graph.py", "The answer is 391."),
        ("async_stream.py", "answer: 391"),
    ],
)
def test_every_example_script_answers_as_its_docstring_says(script: str, line: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert line in done.stdout, done.stdout
    assert "Deprecat" not in done.stderr, done.stderr  # current APIs only


@pytest.mark.slow
def test_train_your_graph_trains_each_node_of_a_users_app_on_its_adapter(tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_your_graph.py"), "--output-dir", str(out)],
        capture_output=True,
        text=True,
        check=True,
        timeout=180,  # the example's budget on 2 CPU cores, with the tiny model it builds
    )
    for step in (1, 2):
        assert f"step {step}: reward" in done.stdout, done.stdout
    assert done.stdout.count("rows: router 4, writer 4") == 2  # 2 questions x 2 rollouts
    for node in ("router", "writer"):
        assert (out / "final" / node / "adapter_model.safetensors").is_file()
    assert not (out / "final" / "flowlearn_prompts.json").exists()  # its prompts are its own
    # then the app runs with its trained nodes (`flowlearn.load_trained`) on a new question
    assert "trained app, asked 'What is 6 * 7?': '" in done.stdout, done.stdout
    served = f"--lora-modules router={out}/final/router writer={out}/final/writer"
    assert f"serve it on vLLM: vllm serve {out}/base-model --enable-lora" in done.stdout
    assert served in done.stdout, done.stdout
    assert "Deprecat" not in done.stderr, done.stderr


@pytest.mark.slow
def test_train_your_graph_lists_its_options_and_refuses_unknown_nodes() -> None:
    script = [sys.executable, str(EXAMPLES / "train_your_graph.py")]
    shown = subprocess.run([*script, "--help"], capture_output=True, text=True, check=True)
    for option in ("--model", "--steps", "--output-dir", "--nodes", "--num-generations"):
        assert option in shown.stdout
    refused = subprocess.run([*script, "--nodes", "planner"], capture_output=True, text=True)
    assert refused.returncode == 2 and "not nodes that call the model" in refused.stderr
