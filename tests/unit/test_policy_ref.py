"""The policy a graph calls is one swappable reference: built once, each step's swapped in."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from fakes import FakeChatModel
from flowlearn.engine import PolicyRef, Sampling, by_node
from flowlearn.engine.adapters import NodePolicies
from flowlearn.engine.protocol import continues_prefill
from flowlearn.engine.scripted import ScriptedPolicy, planner_turn
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import exact_match
from flowlearn.graphs import Context
from flowlearn.training.rollouts import Rollouts, agentflow_factory

SAMPLING = Sampling(temperature=0.7, max_new_tokens=8)
CHAT = [{"role": "user", "content": "Hi"}]


def scripted(version: str, reply: str = "ok") -> ScriptedPolicy:
    policy = ScriptedPolicy([reply])
    policy.version = version
    return policy


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


def scorer(answer: str, case: Case):  # type: ignore[no-untyped-def]
    return exact_match(answer, case.reference)


CASES = [Case(str(i), f"Capital {i}?", "paris") for i in range(2)]


def test_a_plain_policy_is_every_nodes_and_a_binding_is_itself() -> None:
    policy = scripted("p@0")
    nodes = by_node(policy)
    assert dict(nodes.trained) == {} and nodes.base is policy
    assert nodes.for_node("planner") is policy and nodes.for_node("verifier") is policy
    several = NodePolicies({"verifier": scripted("v")}, scripted("base"))
    assert by_node(several) is several
    ref = PolicyRef(several)
    assert by_node(ref) is ref


def test_a_swapped_policy_answers_every_call_with_its_version() -> None:
    first, second = scripted("run@0"), scripted("run@1")
    ref = PolicyRef(first)
    front = ref.for_node("planner")
    assert ref.generate(CHAT, SAMPLING).policy_version == "run@0"
    assert front.generate(CHAT, SAMPLING).policy_version == "run@0" and front.version == "run@0"
    ref.swap(second)
    assert front.generate(CHAT, SAMPLING).policy_version == "run@1" and ref.version == "run@1"
    assert len(first.calls) == 2 and len(second.calls) == 1
    assert not continues_prefill(front)  # the scripted policy's own answer, looked up
    ref.release()
    with pytest.raises(RuntimeError, match="between steps"):
        front.generate(CHAT, SAMPLING)
    ref.swap(first)
    assert front.generate(CHAT, SAMPLING).policy_version == "run@0"


def test_node_dispatch_goes_to_each_trained_nodes_current_policy() -> None:
    def step(k: int) -> NodePolicies:
        trained = {n: scripted(f"run@{k}:{n}") for n in ("planner", "verifier")}
        return NodePolicies(trained, scripted(f"run@{k}:base"))

    ref = PolicyRef(step(0))
    assert list(ref) == ["planner", "verifier"] and len(ref) == 2
    planner, verifier, other = ref["planner"], ref.for_node("verifier"), ref.for_node("critic")
    assert ref.trained["planner"] is planner and other is ref.base
    for k in (0, 1):
        ref.swap(step(k))
        versions = [p.generate(CHAT, SAMPLING).policy_version for p in (planner, verifier, other)]
        assert versions == [f"run@{k}:planner", f"run@{k}:verifier", f"run@{k}:base"]
    with pytest.raises(ValueError, match=r"built for trained nodes \['planner', 'verifier'\]"):
        ref.swap(scripted("run@2"))  # the graph holds the trained nodes' fronts


def test_rollouts_build_the_graph_once_and_record_each_steps_versions() -> None:
    built: list[Any] = []
    flow = agentflow_factory(engine(), [lookup])

    def factory(policy: Any) -> Any:
        built.append(policy)
        return flow(policy)

    source = Rollouts(factory, scorer, CASES)
    context = Context(max_turns=1, planner_temperature=0.7)
    for k in range(3):
        planner = scripted(f"run@{k}", planner_turn("lookup"))
        out = source.run(planner, CASES, group_size=2, context=context, step=k, rank=0)
        versions = {
            t["policy_version"] for r in out for t in r.transitions if t["node"] == "planner"
        }
        assert versions == {f"run@{k}"} and len(planner.calls) == 4
    assert len(built) == 1 and isinstance(built[0], PolicyRef)
    with pytest.raises(RuntimeError, match="between steps"):  # released: it holds no step's model
        built[0].generate(CHAT, SAMPLING)


def test_several_trained_nodes_each_run_on_their_own_through_the_reference() -> None:
    built: list[Any] = []
    flow = agentflow_factory(engine(), [lookup])

    def factory(policy: Any) -> Any:
        built.append(policy)
        return flow(policy)

    source = Rollouts(factory, scorer, CASES, concurrency=1)
    context = Context(max_turns=1, planner_temperature=0.7)
    for k in range(2):
        trained = {
            "planner": scripted(f"run@{k}:planner", planner_turn("lookup")),
            "verifier": scripted(f"run@{k}:verifier", "Conclusion: STOP"),
        }
        policies = NodePolicies(trained, scripted(f"run@{k}:base"))
        out = source.run(policies, CASES, group_size=1, context=context, step=k, rank=0)
        recorded = {(t["node"], t.get("policy_version")) for r in out for t in r.transitions}
        assert {v for n, v in recorded if n in trained} == {f"run@{k}:{n}" for n in trained}
    assert len(built) == 1 and list(built[0]) == ["planner", "verifier"]


def test_a_step_beside_a_running_one_gets_a_graph_of_its_own() -> None:
    built: list[Any] = []
    source = Rollouts(lambda policy: built.append(policy) or object(), scorer, CASES)
    with (
        source.graph_around(scripted("producer@0")) as first,
        source.graph_around(scripted("eval@0")) as second,
    ):
        assert first is not second and len(built) == 2
        assert [ref.version for ref in built] == ["producer@0", "eval@0"]
    with source.graph_around(scripted("producer@1")) as again:
        assert again in (first, second) and len(built) == 2


@pytest.mark.slow
def test_three_online_steps_build_the_graph_once(tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from trainer_setup import CONTEXT, config, load

    from flowlearn.training import TrajectoryStore
    from flowlearn.training.trainer import FlowGRPOTrainer

    rng = random.Random(0)

    def respond(messages: Any, tools: list[dict[str, Any]]) -> Any:
        if tools:
            return AIMessage(
                content="", tool_calls=[{"name": "lookup", "args": {"query": "q"}, "id": "1"}]
            )
        return f"Conclusion: STOP <answer>{rng.choice(['paris', 'rome'])}</answer>"

    built: list[Any] = []
    flow = agentflow_factory(FakeChatModel(respond=respond), [lookup])

    def factory(policy: Any) -> Any:
        built.append(policy)
        return flow(policy)

    model, tokenizer = load(tiny_model_dir)
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    trainer = FlowGRPOTrainer.online(
        model,
        args=config(tmp_path, per_device_train_batch_size=4, num_generations=2, max_steps=3),
        graph_factory=factory,
        scorer=scorer,
        cases=[Case(str(i), f"Capital {i}?", "paris") for i in range(4)],
        context=CONTEXT,
        processing_class=tokenizer,
        rollout_store=store,
    )
    trainer.train()
    assert len(built) == 1  # built at the first step; steps 2 and 3 swapped their policy in
    by_step: dict[str, set[str]] = {}
    for rollout in store.load():
        step = rollout.trajectory_id.split(":", 1)[0]
        for t in rollout.transitions:
            if t["node"] == "planner":
                by_step.setdefault(step, set()).add(t["policy_version"].rsplit("@", 1)[1])
    assert by_step == {"step0": {"0"}, "step1": {"1"}, "step2": {"2"}}


@pytest.mark.slow
def test_a_users_app_is_built_once_and_each_node_records_its_steps_version(
    tiny_model_dir: Path,
) -> None:
    pytest.importorskip("peft")
    from langgraph.graph import END, START, MessagesState, StateGraph
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flowlearn.engine.adapters import node_policies
    from flowlearn.engine.local import HFPolicy
    from flowlearn.evals.scorers import Score
    from flowlearn.graphs.trainable import trainable_graph
    from flowlearn.training.roles import with_node_adapters

    nodes = ("router", "writer")
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model = with_node_adapters(base, dict.fromkeys(nodes, settings)).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    builds: list[Any] = []

    def app(chat: Any) -> Any:
        builds.append(chat)
        graph = StateGraph(MessagesState)
        for node in nodes:
            graph.add_node(node, lambda state: {"messages": [chat.invoke(state["messages"])]})
        graph.add_edge(START, "router")
        graph.add_edge("router", "writer")
        graph.add_edge("writer", END)
        return graph.compile()

    source = Rollouts(trainable_graph(app), lambda answer, case: Score(1.0, "any"), CASES)
    context = Context(planner_temperature=0.7, planner_max_new_tokens=4)
    for k in range(2):  # 4 rollouts a step: the nodes' calls decode in one mixed batch
        policies = node_policies(HFPolicy(model, tokenizer, version=f"run@{k}"), nodes)
        out = source.run(policies, CASES, group_size=2, context=context, step=k, rank=0)
        recorded = {(t["node"], t["policy_version"]) for r in out for t in r.transitions}
        assert recorded == {(n, f"run@{k}:{n}") for n in nodes}
    assert len(builds) == 1  # the user's app, built once around the run's reference
