"""A trained LangGraph app, back in use: `load_trained` gives each trained node its adapter,
loaded here from any folder or served by vLLM under the node's name (`serve_command`)."""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import torch
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from lora_server_stand_in import StandInLoraServer
from peft import LoraConfig
from stand_in_server import stand_in_server
from tiny_model import build_tiny_model
from trainer_setup import config
from transformers import AutoModelForCausalLM, AutoTokenizer

import flowlearn
from flowlearn.engine.adapters import active_adapter
from flowlearn.engine.local import adapters_off
from flowlearn.engine.saved_adapters import ADAPTERS_RECORD
from flowlearn.errors import UsageError
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context
from flowlearn.graphs.trainable import TransitionRecorder, messages_input, trainable_graph
from flowlearn.training.roles import with_node_adapters
from flowlearn.training.trainer import FlowGRPOTrainer

NODES = ("router", "writer")
QUESTION = "Which tool tells the height of Everest?"  # a question training never saw


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"{topic}: nothing known"


def router_writer(model: Any) -> Any:
    """A user's app: a router that may call a tool, then a writer that answers."""
    router_model = model.bind_tools([lookup])

    def router(state: MessagesState) -> dict[str, Any]:
        return {"messages": [router_model.invoke(state["messages"])]}

    def writer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("router", router)
    graph.add_node("writer", writer)
    graph.add_edge(START, "router")
    graph.add_edge("router", "writer")
    graph.add_edge("writer", END)
    return graph.compile()


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`final/` of one training step of both nodes, on a base of its own (absolute path)."""
    root = tmp_path_factory.mktemp("trained-app")
    base = build_tiny_model(root / "base")
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    model = with_node_adapters(
        AutoModelForCausalLM.from_pretrained(base), dict.fromkeys(NODES, settings)
    )

    def length(answer: str, case: Case) -> Score:  # varies within a group: advantages not 0
        return Score(min(len(answer), 100) / 100, "length")

    trainer = FlowGRPOTrainer.online(
        model,
        # a large step, so that each adapter moves its node's logprobs well off the base's
        args=config(root, num_generations=2, max_completion_length=8, learning_rate=5e-2),
        graph_factory=trainable_graph(router_writer),
        scorer=length,
        cases=[Case(str(i), f"Question {i}?", "") for i in range(2)],
        context=Context(planner_temperature=0.7, planner_max_new_tokens=8),
        processing_class=AutoTokenizer.from_pretrained(base),
        nodes=list(NODES),
    )
    trainer.train()
    trainer.save_model(str(root / "final"))
    return root / "final"


def logprobs_of(model: Any, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The completion's logprobs under the model as it is set (temperature 1, as greedy logs)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    scores = torch.log_softmax(logits.float(), -1)
    return scores.gather(1, torch.tensor(completion)[:, None])[:, 0]


def test_a_trained_app_runs_from_another_folder_each_node_on_its_own_adapter(
    result: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the base is recorded absolute: it resolves from anywhere
    trained = flowlearn.load_trained(result)
    assert trained.nodes == NODES and Path(trained.base).is_absolute()
    app = trained.graph(router_writer, max_new_tokens=8)
    recorder = TransitionRecorder()  # only to see what each call ran on
    state = app.invoke(messages_input(QUESTION), {"callbacks": [recorder]})
    assert state["messages"][0].text == QUESTION and len(state["messages"]) == 3
    calls = recorder.transitions
    assert [(c["node"], c["policy_version"]) for c in calls] == [
        ("router", "final:router"),
        ("writer", "final:writer"),
    ]
    model = trained.policies.base.model  # the one base, both adapters on it
    for call in calls:
        prompt, completion = call["prompt_ids"], call["completion_ids"]
        recorded = torch.tensor(call["logprobs"])
        with active_adapter(model, call["node"]):
            assert torch.allclose(recorded, logprobs_of(model, prompt, completion), atol=1e-4)
        other = next(n for n in NODES if n != call["node"])
        with active_adapter(model, other):
            assert not torch.allclose(recorded, logprobs_of(model, prompt, completion), atol=1e-3)
        with adapters_off(model):
            assert not torch.allclose(recorded, logprobs_of(model, prompt, completion), atol=1e-3)
    pinned = trained.chat_model("writer", max_new_tokens=8).invoke(QUESTION)
    assert pinned.response_metadata["model"] == "final:writer"  # outside any node: the writer's
    with pytest.raises(UsageError, match=r"'tools' was not trained .* \['router', 'writer'\]"):
        trained.chat_model("tools")


def test_load_trained_refuses_another_base_and_a_folder_that_is_no_result(
    result: Path, tmp_path: Path
) -> None:
    copy = shutil.copytree(result, tmp_path / "final")
    other = build_tiny_model(tmp_path / "other", seed=1)  # same shapes, other weights
    record = (copy / ADAPTERS_RECORD).read_text()
    base = flowlearn.load_trained(result).base
    (copy / ADAPTERS_RECORD).write_text(record.replace(base, str(other)))
    with pytest.raises(UsageError, match=r"another model \(weights sample sha256 differs\)"):
        flowlearn.load_trained(copy)
    with pytest.raises(UsageError, match=r"no training result at .*: give the run's final/"):
        flowlearn.load_trained(tmp_path / "missing")


def test_the_serve_command_names_each_nodes_adapter_after_the_node(result: Path) -> None:
    trained = flowlearn.load_trained(result, server_url="http://127.0.0.1:9/v1")  # no model here
    base = trained.base
    assert trained.serve_command(port=8000) == [
        "vllm", "serve", base, "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
        "--lora-modules", f"router={result / 'router'}", f"writer={result / 'writer'}",
        "--logprobs-mode", "processed_logprobs", "--port", "8000",
    ]  # fmt: skip
    assert shlex.split(trained.serve_command_line()) == trained.serve_command()


@pytest.fixture
def served(result: Path) -> Iterator[StandInLoraServer]:
    server = StandInLoraServer.serving(flowlearn.load_trained(result).serve_command())
    yield server
    server.close()


def test_the_served_app_names_each_nodes_adapter_and_decodes_as_the_local_one(
    result: Path, served: StandInLoraServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert [load.name for load in served.loads] == list(NODES)  # started with both
    local = flowlearn.load_trained(result).graph(router_writer, max_new_tokens=8)
    expected = TransitionRecorder()
    local.invoke(messages_input(QUESTION), {"callbacks": [expected]})
    with stand_in_server(served) as server:
        trained = flowlearn.load_trained(result, server_url=f"{server.url}/v1")
        app = trained.graph(router_writer, max_new_tokens=8)
        recorder = TransitionRecorder()
        state = app.invoke(messages_input(QUESTION), {"callbacks": [recorder]})
        direct = trained.chat_model().invoke(QUESTION)  # outside any node: the base's
    assert served.models_named == ["router", "writer", trained.base]
    sent = [r.body["prompt"] for r in server.requests if r.path == "/v1/completions"]
    calls = recorder.transitions
    assert [c["policy_version"] for c in calls] == ["final:router@server", "final:writer@server"]
    for call, here, prompt in zip(calls, expected.transitions, sent[:2], strict=True):
        assert call["prompt_ids"] == prompt == here["prompt_ids"]  # rendered here, sent as ids
        assert call["completion_ids"] == here["completion_ids"]  # each node's own weights
        assert torch.allclose(torch.tensor(call["logprobs"]), torch.tensor(here["logprobs"]))
    assert state["messages"][-1].text == local.invoke(messages_input(QUESTION))["messages"][-1].text
    assert direct.response_metadata["model"] == "final:base@server"


def test_flowlearn_serve_prints_the_command_or_says_where_to_run_it(
    result: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from flowlearn.cli import main
    from flowlearn.compose.trained import read_result

    expected = read_result(result).serve_command_line(port=8001)
    assert main(["serve", str(result), "--print", "--port", "8001"]) == 0
    assert capsys.readouterr().out.strip() == expected
    monkeypatch.setenv("PATH", str(tmp_path))  # no vllm on this machine
    assert main(["serve", str(result), "--port", "8001"]) == 78  # a setup error
    said = capsys.readouterr().err
    assert "vllm is not installed here" in said and said.strip().endswith(expected)
    assert main(["serve", str(tmp_path / "none"), "--print"]) == 2
    assert "no training result at" in capsys.readouterr().err
