"""Any graph trains: a custom two-node graph (planner, then generator) on the synthetic task."""

from __future__ import annotations

import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("trl")

from langgraph.graph import END, START, StateGraph
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig

from flowlearn.evals.benchmarks import score_case
from flowlearn.evals.cases import Case
from flowlearn.nodes import Policy, Sampling, policy_transition, token_faithful
from flowlearn.nodes.tools import local_search_tool, python_tool
from flowlearn.training import TrajectoryStore
from flowlearn.training.trainer import FlowGRPOTrainer
from learning.task import make_cases, write_corpus


class PickState(TypedDict, total=False):
    question: str
    tool: str
    answer: str
    transitions: Annotated[list[Any], operator.add]


def two_node_graph(policy: Policy, corpus: Path) -> Any:
    """The policy names a tool; the generator runs it on the question and answers."""
    tools = {"python": python_tool(), "local_search": local_search_tool(corpus)}

    def planner(state: PickState) -> dict[str, Any]:
        messages = [{"role": "user", "content": f"{state['question']}\nTool (python or search):"}]
        generation = policy.generate(messages, Sampling(temperature=0.7, max_new_tokens=6))
        # The untrained tiny model cannot spell tool names: its first token's parity decides.
        tool = "python" if generation.completion_ids[0] % 2 == 0 else "local_search"
        record = policy_transition("planner", 1, messages, generation)
        return {"tool": tool, "transitions": [record]}

    def generator(state: PickState) -> dict[str, Any]:
        question = state["question"]
        if state["tool"] == "python":
            expression = question.removeprefix("What is ").removesuffix("?")
            code = f"print({expression})" if "+" in expression else "print('unknown')"
            return {"answer": tools["python"].invoke({"code": code}).strip()}
        passage = tools["local_search"].invoke({"query": question})
        return {"answer": passage.split("\n", 2)[1].split(" is the capital")[0].strip()}

    graph = StateGraph(PickState)
    graph.add_node("planner", planner)
    graph.add_node("generator", generator)
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "generator")
    graph.add_edge("generator", END)
    return graph.compile()


def test_a_custom_two_node_graph_trains(tiny_model_dir: Path, tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.jsonl")
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")

    def scorer(answer: str, case: Case) -> Any:
        return score_case("exact_match", answer, case)

    trainer = FlowGRPOTrainer.online(
        model,
        args=GRPOConfig(
            output_dir=str(tmp_path / "out"),
            # 2 questions x 4 rollouts per step: a group learns nothing when its 4 first tokens
            # share a parity (1 in 8), so no update in 2 steps has odds 8**-4
            per_device_train_batch_size=8,
            num_generations=4,
            steps_per_generation=1,
            max_steps=2,
            learning_rate=1e-3,
            temperature=0.7,
            loss_type="dapo",
            beta=0.0,
            max_completion_length=6,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            use_cpu=True,
            bf16=False,
        ),
        graph_factory=lambda policy: two_node_graph(policy, corpus),
        scorer=scorer,
        cases=make_cases(4, seed=0),
        processing_class=tokenizer,
        rollout_store=store,
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.train()
    assert any((before[k] - v).abs().sum() > 0 for k, v in model.state_dict().items())
    rollouts = store.load()
    assert len(rollouts) == 2 * 2 * 4
    assert all(r.answer for r in rollouts)  # the generator ran the chosen tool
    turns = [t for r in rollouts for t in r.transitions]
    assert {t["node"] for t in turns} == {"planner"} and all(token_faithful(t) for t in turns)
    logged = [h for h in trainer.state.log_history if "flow/rows" in h]
    assert [h["flow/rows"] for h in logged] == [8.0, 8.0]  # every policy call became a row


def test_graph_factory_and_engine_exclude_each_other(tiny_model_dir: Path, tmp_path: Path) -> None:
    from fakes import FakeChatModel

    with pytest.raises(ValueError, match="graph_factory or engine and tools"):
        FlowGRPOTrainer.online(
            AutoModelForCausalLM.from_pretrained(tiny_model_dir),
            args=GRPOConfig(
                output_dir=str(tmp_path),
                per_device_train_batch_size=2,
                num_generations=2,
                temperature=0.7,
                loss_type="dapo",
                use_cpu=True,
                report_to="none",
            ),
            graph_factory=lambda policy: None,
            engine=FakeChatModel(),
            tools=[python_tool()],
            scorer=lambda answer, case: None,
            cases=make_cases(2, seed=0),
        )
