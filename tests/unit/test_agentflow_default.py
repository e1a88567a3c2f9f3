"""AgentFlow's flow is the default; the embedded model's tuning is a preset chosen by name."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.compose import PROMPT_SETS, FlowSpec, UsageError
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes import make_generator, make_planner
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS, WORKED_ANSWERS

SMALL_MODEL_EXAMPLES = ("Kora Bridge", "Glass Road", "Ana Petrov", "Tana Dam", "Lena Ost")
FIELDS_IN_ORDER = ("Justification:", "Context:", "Sub-Goal:", "Tool Name:")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def agentflow_plan(tool_name: str) -> str:
    return (
        "Justification: the question is a sum.\nContext: 2 and 3.\n"
        f"Sub-Goal: add 2 and 3.\nTool Name: {tool_name}\n"
    )


def prompts_of(transitions: list[dict[str, Any]]) -> str:
    return "\n".join(m["content"] for t in transitions for m in t["messages"])


def assert_agentflow_planner_prompt(text: str) -> None:
    at = [text.index(f"**{field}**") for field in FIELDS_IN_ORDER]
    assert at == sorted(at), text


def test_the_default_graph_analyses_plans_in_the_papers_order_and_shows_no_worked_answers() -> None:
    policy = ScriptedPolicy([agentflow_plan("add")])
    engine = FakeChatModel(text="Goal: add.\nConclusion: STOP\n<answer>5</answer>")
    graph = build_agentflow(policy, engine, [add])
    state = graph.invoke({"question": "What is 2 + 3?"}, context=Context())
    nodes = [t["node"] for t in state["transitions"]]
    assert nodes == ["query_analysis", "planner", "executor", "verifier", "generator"]
    assert state["analysis"].startswith("Goal: add.") and state["answer"] == "5"
    planner = next(t for t in state["transitions"] if t["node"] == "planner")
    asked = planner["messages"][-1]["content"]
    assert planner["messages"][-1]["role"] == "user"  # no prefilled reply
    assert_agentflow_planner_prompt(asked)
    assert "**Query Analysis:** Goal: add." in asked and "Current Step:** 1 of at most 10" in asked
    everything = prompts_of(state["transitions"])
    assert not any(name in everything for name in SMALL_MODEL_EXAMPLES)
    verifier = next(t for t in state["transitions"] if t["node"] == "verifier")
    assert "- add: Add two integers." in verifier["messages"][-1]["content"]
    generator = next(t for t in state["transitions"] if t["node"] == "generator")
    assert len(generator["messages"]) == 2  # system and user: no worked answers
    assert "**Initial Analysis:** Goal: add." in generator["messages"][-1]["content"]


def test_a_run_can_refuse_the_analysis_and_no_section_is_left() -> None:
    policy = ScriptedPolicy([agentflow_plan("add")])
    engine = FakeChatModel(text="Goal.")
    node = make_planner(policy, [add], analysis_engine=engine)
    update = node({"question": "2+3?"}, SimpleNamespace(context=Context(query_analysis=False)))
    assert engine.calls == [] and "Query Analysis" not in policy.calls[0][-1]["content"]
    assert update["plan"]["tool"] == "add"


def test_the_smollm2_preset_keeps_the_embedded_models_tuning() -> None:
    policy = ScriptedPolicy([plan("add")])
    node = make_planner(policy, [add], prompts=SMOLLM2_PROMPTS)
    node({"question": "2+3?"}, SimpleNamespace(context=Context()))
    asked = policy.calls[0][-1]["content"]
    assert "Tool Name: <exactly one of: add>" in asked and "Query analysis" not in asked
    memory = [{"turn": 1, "kind": "action", "tool": "python", "result": "5\n", "error": None}]
    engine = FakeChatModel(text="<answer>5</answer>")
    make_generator(engine, prompts=SMOLLM2_PROMPTS)(
        {"question": "2+3?", "memory": memory}, SimpleNamespace(context=Context())
    )
    shown = [m.content for m in engine.calls[0]]
    assert len(shown) == 2 + 2 * len(WORKED_ANSWERS)
    assert "The python tool printed" in str(shown[-2])  # python's worked answers come last


def test_prompts_are_parameters_a_user_swaps_without_writing_a_node() -> None:
    mine = dataclasses.replace(
        AGENTFLOW_PROMPTS,
        generator="Q: {question}\nM: {memory}\nAnswer in <answer></answer>.",
        system="You are terse.",
    )
    engine = FakeChatModel(text="<answer>5</answer>")
    make_generator(engine, prompts=mine)({"question": "2+3?"}, SimpleNamespace(context=Context()))
    assert [m.content for m in engine.calls[0]] == [
        "You are terse.",
        "Q: 2+3?\nM: (no steps yet)\nAnswer in <answer></answer>.",
    ]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, "smollm2"),
        ({"planner": "default-base"}, "smollm2"),
        ({"planner": "/models/qwen", "engine": "default"}, "smollm2"),
        ({"planner": "/models/qwen"}, "agentflow"),
        ({"planner": "Qwen/Qwen2.5-7B-Instruct", "engine": "/models/qwen"}, "agentflow"),
        ({"planner": "default", "prompts": "agentflow"}, "agentflow"),
        ({"planner": "/models/qwen", "prompts": "smollm2"}, "smollm2"),
        ({"planner": "served", "planner_url": "http://h/v1", "engine": "/m"}, "agentflow"),
    ],
)
def test_the_composition_root_applies_the_preset_to_the_embedded_model(
    spec: dict[str, str], expected: str
) -> None:
    assert FlowSpec(**spec).prompt_set() is PROMPT_SETS[expected]


def test_a_trained_planner_keeps_the_prompt_set_it_was_trained_under(tmp_path: Path) -> None:
    from flowlearn.nodes.prompts import PROMPTS_RECORD, write_prompts_record

    write_prompts_record(tmp_path, SMOLLM2_PROMPTS)
    assert FlowSpec(planner=str(tmp_path)).prompt_set() is SMOLLM2_PROMPTS
    assert FlowSpec(planner=str(tmp_path), prompts="agentflow").prompt_set() is AGENTFLOW_PROMPTS
    (tmp_path / PROMPTS_RECORD).write_text('{"prompts": "tiny-tuned"}')
    with pytest.raises(UsageError, match="trained under the prompt set 'tiny-tuned'"):
        FlowSpec(planner=str(tmp_path)).prompt_set()
    (tmp_path / PROMPTS_RECORD).write_text("not json")
    with pytest.raises(UsageError, match=f"{PROMPTS_RECORD} does not name a prompt set"):
        FlowSpec(planner=str(tmp_path)).prompt_set()


def test_a_trained_planner_keeps_the_engine_it_was_trained_against(tmp_path: Path) -> None:
    from flowlearn.nodes.prompts import write_prompts_record

    assert FlowSpec(planner=str(tmp_path)).engine_choice() == (
        None,
        "the planner's model, untrained",
    )
    write_prompts_record(tmp_path, AGENTFLOW_PROMPTS, engine="default-base")
    trained = FlowSpec(planner=str(tmp_path))
    assert trained.engine_choice() == ("default-base", f"the one {tmp_path} was trained against")
    assert trained.prompt_set() is AGENTFLOW_PROMPTS  # the record's prompts win over the engine's
    named = FlowSpec(planner=str(tmp_path), engine="/models/judge")
    assert named.engine_choice() == ("/models/judge", "as named")


def test_an_unknown_prompt_set_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"unknown prompt set 'smollm'.*agentflow"):
        FlowSpec(prompts="smollm")
    assert FlowSpec.from_env({"FLOWLEARN_PROMPTS": "agentflow"}).prompts == "agentflow"


def test_flowlearn_run_on_a_plain_model_folder_saves_agentflow_prompts(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from flowlearn.cli import main

    out = tmp_path / "run.jsonl"
    folder = str(tiny_model_dir)
    argv = ["run", "What is 17 * 23?", "--planner", folder, "--engine", folder]
    argv += ["--max-turns", "1", "--max-new-tokens", "8", "--engine-max-new-tokens", "8"]
    assert main([*argv, "--seed", "0", "--save", str(out)]) == 0
    assert "prompts: agentflow  query analysis: on" in capsys.readouterr().out
    run = json.loads(out.read_text().splitlines()[0])
    nodes = [t["node"] for t in run["transitions"]]
    assert nodes[0] == "query_analysis" and "planner" in nodes
    planner = next(t for t in run["transitions"] if t["node"] == "planner")
    assert_agentflow_planner_prompt(planner["messages"][-1]["content"])
    everything = prompts_of(run["transitions"])
    assert not any(name in everything for name in SMALL_MODEL_EXAMPLES)


def test_each_planner_call_gets_a_fresh_stop_watch() -> None:
    """A stop watch keeps the state of the one generation it watches: shared across calls, the
    first plan's stop would end every later plan at its first token."""
    from flowlearn.engine import Generation

    class Tokenizer:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return "".join(map(chr, ids))

    class LocalStandIn:
        continues_prefill = True
        handle = SimpleNamespace(tokenizer=Tokenizer())
        version = "stand-in"

        def __init__(self) -> None:
            self.watches: list[Any] = []

        def generate(
            self, messages: Any, sampling: Any, *, streamer: Any = None, stopping: Any = None
        ) -> Generation:
            assert stopping.reason is None  # a watch that has not fired yet
            self.watches.append(stopping)
            text = " add\nJustification: j\nContext: c\nSub-Goal: s\n"
            ids = [ord(c) for c in text]
            assert stopping.update(ids) and stopping.reason == "stop"  # the plan is complete
            return Generation(
                text=text, prompt_ids=[1], completion_ids=ids, logprobs=[-0.1] * len(ids)
            )

    policy = LocalStandIn()
    node = make_planner(policy, [add], prompts=SMOLLM2_PROMPTS)
    for _ in range(2):
        update = node({"question": "2+3?"}, SimpleNamespace(context=Context()))
        assert update["plan"]["tool"] == "add"
    first, second = policy.watches
    assert first is not second


def test_a_new_question_on_a_thread_starts_a_fresh_run_and_history_keeps_the_last(
    tmp_path: Path,
) -> None:
    from langgraph.checkpoint.sqlite import SqliteSaver

    policy = ScriptedPolicy([agentflow_plan("add")])
    engine = FakeChatModel(text="Goal.\nConclusion: STOP\n<answer>5</answer>")
    config: Any = {"configurable": {"thread_id": "user-1"}}
    with SqliteSaver.from_conn_string(str(tmp_path / "threads.sqlite")) as saver:
        graph = build_agentflow(policy, engine, [add], checkpointer=saver)
        first = graph.invoke({"question": "What is 2 + 3?"}, config, context=Context())
        second = graph.invoke({"question": "What is 4 + 1?"}, config, context=Context())
        history = [s.values for s in graph.get_state_history(config)]
    assert first["turn"] == 1 and len(first["memory"]) == 2  # an action and its verification
    assert second["turn"] == 1 and second["termination"] == "verifier_stop"
    assert [r["kind"] for r in second["memory"]] == ["action", "verification"]
    nodes = [t["node"] for t in second["transitions"]]
    assert nodes == ["query_analysis", "planner", "executor", "verifier", "generator"]
    asked = next(t for t in second["transitions"] if t["node"] == "planner")["messages"][-1]
    assert "What is 4 + 1?" in asked["content"] and "2 + 3" not in asked["content"]
    assert any(v.get("question") == "What is 2 + 3?" and v.get("answer") for v in history)


def test_training_a_trained_planner_further_keeps_its_engine(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from flowlearn.compose import training_spec
    from flowlearn.compose.training import engine_source
    from flowlearn.nodes.prompts import write_prompts_record
    from flowlearn.training.config import FlowGRPOConfig

    write_prompts_record(tmp_path, SMOLLM2_PROMPTS, engine="default-base")
    config = FlowGRPOConfig(planner=str(tmp_path), benchmark="gameof24")
    spec = training_spec(config)
    assert spec.engine == "default-base" and engine_source(config, spec) == "default-base"
    base = FlowGRPOConfig(planner=str(tmp_path), benchmark="gameof24", engine="base")
    assert engine_source(base, training_spec(base)) == str(tmp_path)  # its own adapter off
