"""Any LangGraph app trains: its chat model records each call as the calling node's transition."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

pytest.importorskip("peft")

import torch
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from fakes import FakeChatModel
from flowlearn.engine.adapters import node_policies
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.local import HFPolicy, chat_prompt_ids
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context
from flowlearn.graphs.trainable import (
    TrainableChatModel,
    TransitionRecorder,
    trainable_graph,
)
from flowlearn.secrets import REDACTED
from flowlearn.training import TrajectoryStore
from flowlearn.training.roles import with_node_adapters
from flowlearn.training.trainer import FlowGRPOTrainer

CONTEXT = Context(planner_temperature=0.7, planner_max_new_tokens=8)


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"{topic}: nothing known"


def router_writer(model: Any) -> Any:
    """A user's app: a router that may call a tool, a writer that drafts, then answers."""
    router_model = model.bind_tools([lookup])

    def router(state: MessagesState) -> dict[str, Any]:
        return {"messages": [router_model.invoke(state["messages"])]}

    def writer(state: MessagesState) -> dict[str, Any]:
        draft = model.invoke([SystemMessage("Draft an answer."), *state["messages"]])
        return {"messages": [draft, model.invoke([*state["messages"], draft])]}

    graph = StateGraph(MessagesState)
    graph.add_node("router", router)
    graph.add_node("writer", writer)
    graph.add_edge(START, "router")
    graph.add_edge("router", "writer")
    graph.add_edge("writer", END)
    return graph.compile()


def tiny_policy(tiny_model_dir: Path) -> HFPolicy:
    return HFPolicy(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        AutoTokenizer.from_pretrained(tiny_model_dir),
    )


def test_runs_in_parallel_threads_keep_their_own_calls_tagged_by_node(
    tiny_model_dir: Path,
) -> None:
    policy = BatchingPolicy(tiny_policy(tiny_model_dir), max_batch_size=8)
    graph = trainable_graph(router_writer)(policy)
    questions = [f"Question number {i}?" for i in range(8)]
    with ThreadPoolExecutor(8) as pool:  # the calls of all 8 runs decode in shared batches
        states = list(pool.map(lambda q: graph.invoke({"question": q}, context=CONTEXT), questions))
    for question, state in zip(questions, states, strict=True):
        calls = state["transitions"]
        assert [(t["node"], t["turn"]) for t in calls] == [
            ("router", 1),
            ("writer", 1),
            ("writer", 2),
        ]
        for call in calls:  # each call saw its own run's question and no other
            seen = {q for q in questions for m in call["messages"] if q in m["content"]}
            assert seen == {question}
        assert state["question"] == question and state["turn"] == 3
        assert state["answer"] == state["state"]["messages"][-1].text
        assert all(t["sampling"]["temperature"] == 0.7 for t in calls)
    assert len(graph._built) == 1  # the user's graph is built once, not per rollout


def test_recorded_ids_and_logprobs_are_the_policys(tiny_model_dir: Path) -> None:
    policy = tiny_policy(tiny_model_dir)
    recorder = TransitionRecorder()
    app = router_writer(TrainableChatModel(policy=policy, temperature=0.7, max_new_tokens=8))
    state = app.invoke(
        {"messages": [HumanMessage("Capital of France?")]}, {"callbacks": [recorder]}
    )
    replies = [m for m in state["messages"] if m.type == "ai"]
    assert len(recorder.transitions) == len(replies) == 3
    for transition, reply in zip(recorder.transitions, replies, strict=True):
        for key in ("prompt_ids", "completion_ids", "logprobs"):
            assert transition[key] == reply.response_metadata[key]
        # the chat as the policy saw it: its prompt ids render from the recorded messages
        assert transition["prompt_ids"] == chat_prompt_ids(policy.tokenizer, transition["messages"])
        prompt, completion = transition["prompt_ids"], transition["completion_ids"]
        with torch.no_grad():
            logits = policy.model(torch.tensor([prompt + completion])).logits[0]
        scores = torch.log_softmax(logits[len(prompt) - 1 : -1] / 0.7, dim=-1)
        expected = scores.gather(1, torch.tensor(completion)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(transition["logprobs"]), expected, atol=1e-4)
        assert transition["policy_version"] == policy.version
    tools_note = recorder.transitions[0]["messages"][0]["content"]
    assert "lookup" in tools_note  # the router's bound tool, as the policy was told of it


def test_each_trained_node_calls_on_its_own_adapter_and_the_others_on_the_base(
    tiny_model_dir: Path,
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = with_node_adapters(model, {"router": settings, "planner": settings})
    policy = HFPolicy(peft_model, AutoTokenizer.from_pretrained(tiny_model_dir))
    graph = trainable_graph(router_writer)(node_policies(policy, ["router"]))
    state = graph.invoke({"question": "Hi?"}, context=CONTEXT)
    versions = {t["node"]: t["policy_version"].rsplit(":", 1)[-1] for t in state["transitions"]}
    assert versions == {"router": "router", "writer": "base"}
    misnamed = trainable_graph(router_writer)(node_policies(policy, ["planner"]))
    with pytest.warns(UserWarning, match=r"\['planner'\] are not nodes of the graph"):
        misnamed.graph(CONTEXT.planner_sampling())


def test_calls_of_other_models_are_run_but_not_recorded(tiny_model_dir: Path) -> None:
    other = FakeChatModel(respond=lambda messages, tools: "from another model")
    ours = TrainableChatModel(policy=tiny_policy(tiny_model_dir), max_new_tokens=4)

    def build(model: Any) -> Any:
        graph = StateGraph(MessagesState)
        graph.add_node("ours", lambda state: {"messages": [model.invoke(state["messages"])]})
        graph.add_node("other", lambda state: {"messages": [other.invoke(state["messages"])]})
        graph.add_edge(START, "ours")
        graph.add_edge("ours", "other")
        graph.add_edge("other", END)
        return graph.compile()

    recorder = TransitionRecorder()
    state = build(ours).invoke({"messages": [HumanMessage("Hi?")]}, {"callbacks": [recorder]})
    assert state["messages"][-1].text == "from another model"
    assert [t["node"] for t in recorder.transitions] == ["ours"]


def test_async_nodes_and_streamed_calls_are_recorded(tiny_model_dir: Path) -> None:
    model = TrainableChatModel(policy=tiny_policy(tiny_model_dir), max_new_tokens=4)

    async def thinker(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    def streamer(state: MessagesState) -> dict[str, Any]:
        (reply,) = model.stream(state["messages"])  # the whole reply, its ids included
        assert reply.response_metadata["completion_ids"]
        return {"messages": [reply]}

    graph = StateGraph(MessagesState)
    graph.add_node("thinker", thinker)
    graph.add_node("streamer", streamer)
    graph.add_edge(START, "thinker")
    graph.add_edge("thinker", "streamer")
    graph.add_edge("streamer", END)
    recorder = TransitionRecorder()
    asyncio.run(
        graph.compile().ainvoke({"messages": [HumanMessage("Hi?")]}, {"callbacks": [recorder]})
    )
    assert [(t["node"], t["turn"]) for t in recorder.transitions] == [
        ("thinker", 1),
        ("streamer", 1),
    ]
    assert all(t["completion_ids"] and t["logprobs"] for t in recorder.transitions)


def test_a_graph_streamed_token_by_token_is_recorded(tiny_model_dir: Path) -> None:
    app = router_writer(TrainableChatModel(policy=tiny_policy(tiny_model_dir), max_new_tokens=4))
    recorder = TransitionRecorder()
    events = list(
        app.stream(
            {"messages": [HumanMessage("Hi?")]}, {"callbacks": [recorder]}, stream_mode="messages"
        )
    )
    assert [meta["langgraph_node"] for _, meta in events] == ["router", "writer", "writer"]
    assert [(t["node"], t["turn"]) for t in recorder.transitions] == [
        ("router", 1),
        ("writer", 1),
        ("writer", 2),
    ]


def adapter_weights(model: Any, node: str) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if "lora_" in n and f".{node}." in n
    }


@pytest.mark.parametrize("max_staleness", [0, 1], ids=["synchronous", "one-step-off-policy"])
def test_a_users_two_node_graph_trains_both_nodes_as_roles(
    tiny_model_dir: Path, tmp_path: Path, max_staleness: int
) -> None:
    from trainer_setup import config

    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    model = with_node_adapters(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        {"router": settings, "writer": settings},
    )
    before = {node: adapter_weights(model, node) for node in ("router", "writer")}
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")

    def length(answer: str, case: Case) -> Score:  # varies within a group: advantages not 0
        return Score(min(len(answer), 100) / 100, "length")

    args = config(
        tmp_path,
        per_device_train_batch_size=8,
        num_generations=4,
        max_steps=1 + max_staleness,  # off-policy: step 2 sampled by step 1's weights
        max_completion_length=8,
    )
    args.max_staleness = max_staleness  # type: ignore[attr-defined]  # FlowGRPOConfig's
    trainer = FlowGRPOTrainer.online(
        model,
        args=args,
        graph_factory=trainable_graph(router_writer),
        scorer=length,
        cases=[Case(str(i), f"Question {i}?", "") for i in range(2 + 2 * max_staleness)],  # 1 epoch
        context=CONTEXT,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        rollout_store=store,
        nodes=["router", "writer"],
    )
    trainer.train()
    calls = [t for r in store.load() for t in r.transitions]
    assert {(t["node"], t["policy_version"].rsplit(":", 1)[-1]) for t in calls} == {
        ("router", "router"),
        ("writer", "writer"),
    }
    logged = [h for h in trainer.state.log_history if "flow/router/rows" in h]
    assert len(logged) == 1 + max_staleness
    assert all(h["flow/router/rows"] == 8 and h["flow/writer/rows"] == 16 for h in logged)
    if max_staleness:  # every row of step 2 was sampled by the weights before update 1
        assert logged[1]["flow/staleness"] == 1 and logged[1]["flow/stale_rows"] == 24
    for node in ("router", "writer"):
        after = adapter_weights(model, node)
        assert any(not torch.equal(before[node][k], after[k]) for k in after), node


def test_trls_shape_takes_a_users_graph_and_refuses_agentflow_parts_beside_it(
    tmp_path: Path,
) -> None:
    from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS
    from flowlearn.training.config import FlowGRPOConfig

    with pytest.raises(ValueError, match="graph_factory or engine, tools and prompts, not both"):
        FlowGRPOTrainer(
            model="unused",
            reward_funcs=["exact_match"],
            args=FlowGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True),
            train_dataset=[{"question": "What is 2 + 2?", "answer": "4"}],
            graph_factory=trainable_graph(router_writer),
            prompts=AGENTFLOW_PROMPTS,
        )


def test_a_served_policy_is_refused_before_any_rollout() -> None:
    from flowlearn.engine.server import ServerPolicy

    with pytest.raises(ValueError, match=r"the base policy, a ServerPolicy, has none here"):
        trainable_graph(router_writer)(ServerPolicy("http://127.0.0.1:9", "served"))


def leaked_forms(key: str) -> list[str]:
    """The key as it is and in the encodings a tool, a library or a server may echo it in."""
    raw = key.encode()
    forms = [key, quote(key, safe=""), quote(key, safe="").lower(), raw.hex(), raw.hex().upper()]
    forms += [json.dumps(key)[1:-1].replace("/", "\\/")]
    for b64 in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        forms += [b64.decode(), b64.decode().rstrip("=")]
    forms += [base64.b64encode(b"user:" + raw).decode()]  # inside `Authorization: Basic`
    return forms


def test_a_key_a_users_tool_echoes_reaches_no_written_file(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow.parquet as pq
    from trainer_setup import config

    from flowlearn.training.trajectories import export_parquet

    key = f"k3y/{uuid.uuid4().hex[:16]}+Zq"  # `/` and `+`: each encoding differs from the rest
    monkeypatch.setenv("TAVILY_API_KEY", key)

    @tool
    def leaky(query: str) -> str:
        """Search the web, echoing the key as a misconfigured client's error does."""
        basic = base64.b64encode(f"user:{key}".encode()).decode()
        return (
            f"403 for key {key}; sent Authorization: Basic {basic}, ?k={quote(key, safe='')} "
            f"and {key.encode().hex()}; config {json.dumps({'api_key': key})}"
        )

    def searcher_writer(model: Any) -> Any:
        def search(state: MessagesState) -> dict[str, Any]:
            call = {"name": "leaky", "args": {"query": "capital of France"}, "id": "call_0"}
            result = leaky.invoke({"query": "capital of France"})
            echoed = ToolMessage(result, name="leaky", tool_call_id="call_0")
            return {"messages": [AIMessage("", tool_calls=[call]), echoed]}

        def writer(state: MessagesState) -> dict[str, Any]:
            return {"messages": [model.invoke(state["messages"])]}

        graph = StateGraph(MessagesState)
        graph.add_node("search", search)
        graph.add_node("writer", writer)
        graph.add_edge(START, "search")
        graph.add_edge("search", "writer")
        graph.add_edge("writer", END)
        return graph.compile()

    def quoting(state: Any) -> str:  # an answer that quotes the tool, as a user's may
        return " | ".join(m.text for m in state["messages"][-2:])

    def echo(answer: str, case: Case) -> Score:  # a reward whose reason quotes the answer
        return Score(min(len(answer), 100) / 100, f"scored {answer}")

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    trainer = FlowGRPOTrainer.online(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=config(
            tmp_path,
            per_device_train_batch_size=2,
            num_generations=2,
            max_steps=1,
            max_completion_length=8,
            save_strategy="steps",
            save_steps=1,
        ),
        graph_factory=trainable_graph(searcher_writer, answer=quoting),
        scorer=echo,
        cases=[Case("0", "Capital of France?", "")],
        context=CONTEXT,
        processing_class=tokenizer,
        rollout_store=store,
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "out" / "final"))
    rollouts = store.load()
    export_parquet(rollouts, tmp_path / "rollouts.parquet")

    calls = [t for r in rollouts for t in r.transitions]
    assert calls and all(t["node"] == "writer" for t in calls)
    for call in calls:  # the policy read the tool's text, redacted; its ids say so exactly
        shown = tokenizer.decode(call["prompt_ids"])
        assert "403 for key [redacted]" in shown and "Basic [redacted]" in shown
        assert call["prompt_ids"] == chat_prompt_ids(tokenizer, call["messages"])
    assert all(
        "403 for key [redacted]" in r.answer and REDACTED in r.reward_reason for r in rollouts
    )
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {"rollouts.jsonl", "rollouts.parquet", "trainer_state.json"} <= {p.name for p in written}
    texts = {p: p.read_bytes().decode("latin-1") for p in written}
    texts[tmp_path / "parquet rows"] = json.dumps(
        pq.read_table(tmp_path / "rollouts.parquet").to_pylist()
    )
    for path, text in texts.items():
        for form in leaked_forms(key):
            assert form not in text, f"{form!r} (the key) is in {path}"
