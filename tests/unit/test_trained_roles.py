"""Several trained roles: a LoRA adapter per node on one base, trained together from one outcome."""

from __future__ import annotations

import json
import random
import zlib
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

import torch
from flow_rows import KeepGradients, toy_config, toy_trajectories
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from flowlearn.engine.adapters import (
    AdapterPolicy,
    active_adapter,
    adapter_names,
    switch_adapter,
)
from flowlearn.engine.local import FrozenBasePolicy, HFPolicy, adapters_off
from flowlearn.engine.sampling import Sampling
from flowlearn.training.roles import with_node_adapters
from flowlearn.training.trainer import FlowGRPOTrainer
from flowlearn.training.trajectories import Trajectory

NODES = ("planner", "verifier")


def two_adapters(tiny_model_dir: Path, seed: int = 0) -> Any:
    """The tiny model with a planner and a verifier adapter, B matrices non-zero."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = with_node_adapters(model, {n: settings for n in NODES})
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # a fresh LoRA B is zero: every adapter would act as the base
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return peft_model


def as_node(trajectories: list[Trajectory], node: str, prefix: str = "") -> list[Trajectory]:
    """The same trajectories with every transition made by `node` (and groups renamed)."""
    out = []
    for t in trajectories:
        transitions = [{**x, "node": node, "group_id": prefix + t.group_id} for x in t.transitions]
        out.append(
            Trajectory(
                prefix + t.trajectory_id,
                prefix + t.group_id,
                t.question,
                t.reference,
                t.answer,
                t.final_text,
                t.reward,
                transitions=transitions,  # type: ignore[arg-type]
            )
        )
    return out


def test_every_adapter_stays_trainable_and_each_node_generates_with_its_own(
    tiny_model_dir: Path,
) -> None:
    model = two_adapters(tiny_model_dir)
    assert adapter_names(model) == ["planner", "verifier"]
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    assert lora and all(p.requires_grad for p in lora)
    base = HFPolicy(model, AutoTokenizer.from_pretrained(tiny_model_dir))
    ids = [5, 6, 7, 8]
    with torch.no_grad():
        outputs = {}
        for node in NODES:
            with active_adapter(model, node):
                outputs[node] = model(torch.tensor([ids])).logits
        with adapters_off(model):
            outputs["base"] = model(torch.tensor([ids])).logits
    assert not torch.allclose(outputs["planner"], outputs["verifier"])
    assert not torch.allclose(outputs["planner"], outputs["base"])
    assert all(p.requires_grad for p in lora)  # PEFT's set_adapter would freeze the other
    sampling = Sampling(temperature=0.0, max_new_tokens=4)
    planner, verifier = AdapterPolicy(base, "planner"), AdapterPolicy(base, "verifier")
    frozen = FrozenBasePolicy(base)
    for policy, scope in ((planner, "planner"), (verifier, "verifier")):
        generation = policy.generate_ids(ids, sampling)
        switch_adapter(model, scope)
        with torch.no_grad():
            logits = model(torch.tensor([ids + generation.completion_ids[:-1]])).logits[0]
        picked = logits[len(ids) - 1 :].argmax(-1).tolist()
        assert picked[: len(generation.completion_ids)] == generation.completion_ids
        assert generation.policy_version.endswith(f":{scope}")
    assert frozen.generate_ids(ids, sampling).policy_version.endswith(":base")
    with pytest.raises(ValueError, match="no adapter"):
        AdapterPolicy(base, "generator")


def test_a_rows_gradient_reaches_only_its_nodes_adapter(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    for trained, other in (("planner", "verifier"), ("verifier", "planner")):
        model = two_adapters(tiny_model_dir)
        trajectories = as_node(toy_trajectories(model), trained)
        keep = KeepGradients()
        trainer = FlowGRPOTrainer.offline(
            model,
            args=toy_config(tmp_path / trained),
            trajectories=trajectories,
            nodes=list(NODES),
            callbacks=[keep],
        )
        trainer.train()
        (gradient,) = keep.steps
        mine = {n for n, _ in model.named_parameters() if f".{trained}." in n and "lora_" in n}
        theirs = {n for n, _ in model.named_parameters() if f".{other}." in n and "lora_" in n}
        assert any(float(gradient[n].abs().sum()) > 0 for n in mine if n in gradient)
        assert all(float(gradient[n].abs().sum()) == 0 for n in theirs if n in gradient)
        assert not any("lora_" not in n for n in gradient)  # the base is frozen


def with_adapters(tiny_model_dir: Path, nodes: tuple[str, ...], scale: float = 0.5) -> Any:
    """The tiny model with an adapter per node; each weight seeded by its name alone, so a
    node's adapter starts the same whichever other adapters the model carries."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = with_node_adapters(model, {n: settings for n in nodes})
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_" in name:
                seed = zlib.crc32(name.encode())
                generator = torch.Generator().manual_seed(seed)
                parameter.copy_(scale * torch.randn(parameter.shape, generator=generator))
    return peft_model


def adapter_weights(model: Any, node: str) -> dict[str, torch.Tensor]:
    return {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if "lora_" in n and f".{node}." in n
    }


def train_one_node(
    tiny_model_dir: Path, tmp_path: Path, node: str, factory: Any
) -> tuple[Any, Any, Any, dict[str, torch.Tensor]]:
    """Train `node`'s adapter alone through `factory`'s graph on four capital questions.

    Returns the model, the trainer, the rollout store and the adapter's weights before.
    """
    from trainer_setup import CONTEXT, config

    from flowlearn.evals.cases import Case
    from flowlearn.evals.scorers import exact_match
    from flowlearn.training import TrajectoryStore

    model = with_adapters(tiny_model_dir, (node,))
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    start = adapter_weights(model, node)
    trainer = FlowGRPOTrainer.online(
        model,
        args=config(tmp_path, per_device_train_batch_size=8, num_generations=4),
        graph_factory=factory,
        scorer=lambda answer, case: exact_match(answer, case.reference),
        cases=[Case(str(i), f"Capital {i}?", "paris") for i in range(4)],
        context=CONTEXT,
        processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        rollout_store=store,
        nodes=[node],
    )
    trainer.train()
    return model, trainer, store, start


@pytest.mark.slow
def test_two_nodes_on_disjoint_rows_train_as_two_one_node_trainings(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    reference = with_adapters(tiny_model_dir, NODES)
    planner_rows = as_node(toy_trajectories(reference, seed=0), "planner")
    verifier_rows = as_node(toy_trajectories(reference, seed=1), "verifier", prefix="v")
    together = with_adapters(tiny_model_dir, NODES)
    FlowGRPOTrainer.offline(
        together,
        args=toy_config(tmp_path / "both", per_device_train_batch_size=16),
        trajectories=planner_rows + verifier_rows,
        nodes=list(NODES),
    ).train()
    for node, rows in (("planner", planner_rows), ("verifier", verifier_rows)):
        alone = with_adapters(tiny_model_dir, (node,))
        start = adapter_weights(alone, node)
        FlowGRPOTrainer.offline(
            alone, args=toy_config(tmp_path / node), trajectories=rows, nodes=[node]
        ).train()
        after_alone, after_together = adapter_weights(alone, node), adapter_weights(together, node)
        moved = sum(float((after_alone[k] - start[k]).abs().max()) for k in start)
        assert moved > 1e-3  # the update did something
        for key, value in after_alone.items():
            assert torch.allclose(after_together[key], value, atol=1e-5, rtol=0), key


@pytest.mark.slow
def test_resume_restores_every_adapter_and_the_optimizer(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    trajectories = as_node(toy_trajectories(with_adapters(tiny_model_dir, NODES)), "planner")
    trajectories += as_node(
        toy_trajectories(with_adapters(tiny_model_dir, NODES), seed=1), "verifier", "v"
    )
    adam = dict(
        per_device_train_batch_size=16, max_steps=2, learning_rate=1e-2, optim="adamw_torch",
        save_strategy="steps", save_steps=1,
    )  # fmt: skip

    def trainer(out: str, model: Any, **extra: Any) -> FlowGRPOTrainer:
        return FlowGRPOTrainer.offline(
            model,
            args=toy_config(tmp_path / out, **{**adam, **extra}),
            trajectories=trajectories,
            nodes=list(NODES),
        )

    straight = with_adapters(tiny_model_dir, NODES)
    trainer("straight", straight).train()
    first = with_adapters(tiny_model_dir, NODES)
    trainer("resumed", first, max_steps=1).train()
    checkpoint = tmp_path / "resumed" / "checkpoint-1"
    assert sorted(
        p.name for p in checkpoint.iterdir() if (p / "adapter_config.json").is_file()
    ) == [
        "planner",
        "verifier",
    ]
    resumed = with_adapters(tiny_model_dir, NODES)
    second = trainer("resumed", resumed)
    second.train(resume_from_checkpoint=str(checkpoint))
    state = second.optimizer.state_dict()["state"]
    assert state and all(int(s["step"]) == 2 for s in state.values())  # Adam's moments came back
    for node in NODES:
        expected, got = adapter_weights(straight, node), adapter_weights(resumed, node)
        for key, value in expected.items():
            assert torch.allclose(got[key], value, atol=1e-5, rtol=0), key


@pytest.mark.slow
def test_a_trained_verifier_rolls_out_with_its_own_adapter_and_learns(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    from fakes import FakeChatModel
    from flowlearn.engine.adapters import NodePolicies
    from flowlearn.engine.scripted import ScriptedPolicy, planner_turn
    from flowlearn.graphs import build_agentflow

    @tool
    def lookup(query: str) -> str:
        """Look up a fact."""
        return "paris"

    rng = random.Random(0)

    def respond(messages: Any, tools: list[dict[str, Any]]) -> Any:
        if tools:
            call = {"name": "lookup", "args": {"query": "q"}, "id": "1"}
            return AIMessage(content="", tool_calls=[call])
        return f"<answer>{rng.choice(['paris', 'rome'])}</answer>"  # outcomes that vary

    engine = FakeChatModel(respond=respond)
    seen: list[NodePolicies] = []

    def factory(policies: NodePolicies) -> Any:
        seen.append(policies)
        planner = ScriptedPolicy([planner_turn("lookup")])  # the planner is not trained here
        return build_agentflow(planner, engine, [lookup], verifier_policy=policies["verifier"])

    model, trainer, store, start = train_one_node(tiny_model_dir, tmp_path, "verifier", factory)
    assert len(seen) == 1 and list(seen[0]) == ["verifier"]  # built once, each step swapped in
    calls = [t for r in store.load() for t in r.transitions if t["node"] == "verifier"]
    assert calls and all(t.get("completion_ids") for t in calls)
    assert {t["policy_version"].rsplit(":", 1)[1] for t in calls} == {"verifier"}
    logged = [h for h in trainer.state.log_history if "flow/verifier/rows" in h]
    assert logged and all(h["flow/verifier/rows"] > 0 for h in logged)
    assert all("flow/verifier/entropy" in h for h in logged)
    after = adapter_weights(model, "verifier")
    assert any(not torch.equal(start[k], after[k]) for k in start)


@pytest.mark.slow
@pytest.mark.parametrize("second", ["verifier", "executor"])
def test_train_two_nodes_then_run_the_result(
    second: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flowlearn.cli import main

    out = tmp_path / "two"
    nodes = ("planner", second)
    settings = json.dumps({second: {"learning_rate": 0.01, "max_new_tokens": 8}})
    flags = [
        "--planner", str(tiny_model_dir), "--benchmark", "gameof24", "--limit", "2",
        "--num_generations", "2", "--questions-per-step", "1", "--max-turns", "2",
        "--max_completion_length", "8", "--engine-max-new-tokens", "8", "--max-steps", "2",
        "--train_nodes", ",".join(nodes), "--bf16", "false", "--output-dir", str(out),
        "--node_settings", settings,
    ]  # fmt: skip
    assert main(["train", *flags]) == 0
    final = out / "final"
    for node in nodes:
        assert (final / node / "adapter_config.json").is_file()
        assert (final / node / "adapter_model.safetensors").is_file()
    assert not (out / "final-adapter").exists() and not (final / "config.json").exists()
    record = json.loads((final / "flowlearn_adapters.json").read_text())
    assert (record["base"], record["nodes"]) == (str(tiny_model_dir), list(nodes))
    assert record["base_fingerprint"]["vocab_size"] == 400  # checked when it loads
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    for node in nodes:
        for key in ("mean_reward", "rows", "tokens", "format_error_rate"):
            assert f"flow/{node}/{key}" in last
    capsys.readouterr()
    question = ["run", "What is 2 + 2?", "--planner", str(final), "--max-turns", "2"]
    assert main([*question, "--max-new-tokens", "8", "--engine-max-new-tokens", "8"]) == 0
    printed = capsys.readouterr().out
    assert f"adapters: planner, {second}" in printed and "planner: final:planner" in printed
    assert f"engine: the one {final} was trained against" in printed


def test_recomputed_old_logprobs_score_each_row_under_its_own_nodes_adapter(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = with_adapters(tiny_model_dir, NODES, scale=2.0)  # adapters far apart
    switch_adapter(model, "planner")  # each node's logged logprobs are its own adapter's
    planner_rows = as_node(toy_trajectories(model, seed=0), "planner")
    switch_adapter(model, "verifier")
    verifier_rows = as_node(toy_trajectories(model, seed=1), "verifier", prefix="v")
    trainer = FlowGRPOTrainer.offline(
        model,
        args=toy_config(tmp_path / "out", per_device_train_batch_size=16),
        trajectories=planner_rows + verifier_rows,
        nodes=list(NODES),
        recompute_old_logprobs=True,
    )
    trainer.train()
    (gap,) = [
        h["flow/old_logprob_gap"] for h in trainer.state.log_history if "flow/old_logprob_gap" in h
    ]
    # The logged noise alone (normal, std 0.15: a mean |gap| of 0.12) measured 0.104; scoring
    # every row under one adapter measured 0.165 (deterministic: no sampling, no update yet).
    assert gap < 0.13


def test_nodes_decode_in_one_batch_of_mixed_adapters_as_each_would_alone(
    tiny_model_dir: Path,
) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from flowlearn.engine.adapters import AdapterBatching, mixed_batching, node_policies

    model = with_adapters(tiny_model_dir, NODES, scale=1.0).eval()
    base = HFPolicy(model, AutoTokenizer.from_pretrained(tiny_model_dir), version="m@0")
    alone = node_policies(base, NODES)
    together = mixed_batching(alone, max_batch_size=16)
    assert all(isinstance(p, AdapterBatching) for p in [*together.values(), together.base])
    chats = [[{"role": "user", "content": f"question {i} " + "word " * (i % 3)}] for i in range(4)]
    greedy = Sampling(temperature=0.0, max_new_tokens=6)
    calls = [(node, chat) for node in (*NODES, "base") for chat in chats]

    def run(policies: Any, call: tuple[str, Any]) -> Any:
        node, chat = call
        policy = policies.base if node == "base" else policies[node]
        return policy.generate(chat, greedy)

    expected = [run(alone, call) for call in calls]
    with ThreadPoolExecutor(len(calls)) as pool:  # all in flight: one batch, three adapters
        got = list(pool.map(lambda call: run(together, call), calls))
    assert together.base.batching.stats.steps < sum(len(g.completion_ids) for g in got)
    for (node, _), want, have in zip(calls, expected, got, strict=True):
        assert have.completion_ids == want.completion_ids, node
        assert have.policy_version == want.policy_version
        assert torch.allclose(torch.tensor(have.logprobs), torch.tensor(want.logprobs), atol=1e-4)
    assert {g.policy_version.rsplit(":", 1)[1] for g in got} == {"planner", "verifier", "base"}


def test_a_loaded_result_of_several_nodes_decodes_every_node_and_the_engine_in_one_batch(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`flowlearn run|eval --concurrency N` on such a result: one batch of mixed adapters."""
    from concurrent.futures import ThreadPoolExecutor

    from flowlearn.compose import load_local_models
    from flowlearn.engine.adapters import AdapterBatching
    from flowlearn.engine.saved_adapters import write_adapters_record

    folder = tmp_path / "final"
    with_adapters(tiny_model_dir, NODES, scale=1.0).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    write_adapters_record(folder, str(tiny_model_dir), NODES)
    alone = load_local_models(str(folder))
    together = load_local_models(str(folder), batch_size=8)
    assert together.nodes is not None and alone.nodes is not None
    fronts = [together.planner, together.nodes["verifier"], together.engine.policy]
    assert all(isinstance(p, AdapterBatching) for p in fronts)
    assert len({id(p.batching) for p in fronts}) == 1  # one batch, one worker, one base copy
    assert together.engine.policy is together.nodes.base
    chat = [{"role": "user", "content": "What is 2 + 2?"}]
    greedy = Sampling(temperature=0.0, max_new_tokens=6)
    want = [p.generate(chat, greedy) for p in (alone.planner, alone.nodes["verifier"])]
    want.append(alone.engine.policy.generate(chat, greedy))
    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(lambda p: p.generate(chat, greedy), fronts))
    for have, expected in zip(got, want, strict=True):
        assert have.completion_ids == expected.completion_ids
        assert have.policy_version == expected.policy_version
    assert len({tuple(g.completion_ids) for g in got}) > 1  # the adapters do differ


@pytest.mark.slow
def test_a_trained_executor_writes_its_calls_with_its_own_adapter_and_learns(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from langchain_core.tools import tool

    from fakes import FakeChatModel
    from flowlearn.engine.adapters import NodePolicies
    from flowlearn.engine.scripted import ScriptedPolicy, planner_turn
    from flowlearn.graphs import build_agentflow

    queries: list[str] = []

    @tool
    def lookup(query: str) -> str:
        """Look up a fact."""
        queries.append(query)
        return "paris" if len(query) % 2 else "rome"  # the written query decides the outcome

    engine_tools: list[Any] = []

    def respond(messages: Any, tools: list[dict[str, Any]]) -> Any:
        engine_tools.extend(tools)  # a trained executor's calls must not reach the engine
        found = "paris" if "paris" in str(messages[-1].content) else "rome"  # the tool's result
        return f"Conclusion: STOP\n<answer>{found}</answer>"  # the verifier's and the answer

    def factory(policies: NodePolicies) -> Any:
        planner = ScriptedPolicy([planner_turn("lookup")])  # the planner is not trained here
        engine = FakeChatModel(respond=respond)
        return build_agentflow(planner, engine, [lookup], executor_policy=policies["executor"])

    model, trainer, store, start = train_one_node(tiny_model_dir, tmp_path, "executor", factory)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rollouts = store.load()
    calls = [t for r in rollouts for t in r.transitions if t["node"] == "executor"]
    assert calls and all(t.get("completion_ids") for t in calls)
    assert {t["policy_version"].rsplit(":", 1)[1] for t in calls} == {"executor"}
    opening = '{"name": "lookup", "arguments": {"query": "'
    for call in calls:  # the engine's forced-call chat: instructions, then the prefilled opening
        assert "To call a tool, reply with only a JSON object" in call["messages"][0]["content"]
        assert call["messages"][-1] == {"role": "assistant", "content": opening}
        assert tokenizer.decode(call["prompt_ids"]).endswith(opening)
    assert queries and {r.reward for r in rollouts} == {0.0, 1.0}  # the queries it wrote ran
    assert not engine_tools and all(call["parse_status"] == "ok" for call in calls)
    written = [m["arguments"]["query"] for r in rollouts for m in r.memory if m["kind"] == "action"]
    assert sorted(written) == sorted(queries)  # what ran is what the adapter wrote
    logged = [h for h in trainer.state.log_history if "flow/executor/rows" in h]
    assert logged and all(h["flow/executor/rows"] > 0 for h in logged)
    after = adapter_weights(model, "executor")
    assert any(not torch.equal(start[k], after[k]) for k in start)


def test_the_agentflow_graph_trains_its_executor_but_not_its_generator() -> None:
    from flowlearn.compose.training import check_trainable_nodes
    from flowlearn.errors import UsageError

    check_trainable_nodes(["planner", "verifier", "executor"])
    with pytest.raises(UsageError, match=r"\['generator'\].*the generator runs the fixed engine"):
        check_trainable_nodes(["planner", "generator"])


class WritingPolicy:
    """A trained executor's stand-in: writes `reply` after the prefilled opening, records calls."""

    continues_prefill = True

    def __init__(self, reply: str) -> None:
        from types import SimpleNamespace

        self.reply = reply
        self.tokenizer = SimpleNamespace(decode=lambda ids, **_: "")  # so it gets a stop watch
        self.calls: list[tuple[Any, Sampling, Any]] = []

    def generate(self, messages: Any, sampling: Sampling, stopping: Any = None) -> Any:
        from flowlearn.engine.sampling import Generation

        self.calls.append((messages, sampling, stopping))
        ids = list(range(len(self.reply)))
        return Generation(
            text=self.reply,
            prompt_ids=[1, 2],
            completion_ids=ids,
            logprobs=[-0.5] * len(ids),
            policy_version="run:executor",
        )


def run_written_call(
    reply: str, approve: bool = False
) -> tuple[dict[str, list[str]], Any, WritingPolicy, list[Any]]:
    """One turn of the AgentFlow graph whose trained executor writes `reply` after the opening
    of a `python` call; a `delete` tool is bound too. Returns what each tool ran, the final
    state, the policy and the tools the engine was asked to call."""
    from langchain_core.tools import tool
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    from fakes import FakeChatModel
    from flowlearn.engine.adapters import NodePolicies
    from flowlearn.engine.scripted import ScriptedPolicy, planner_turn
    from flowlearn.graphs import Context
    from flowlearn.training.rollouts import agentflow_factory

    ran: dict[str, list[str]] = {"python": [], "delete": []}

    @tool
    def python(code: str) -> str:
        """Run Python code."""
        ran["python"].append(code)
        return "4"

    @tool
    def delete(path: str) -> str:
        """Delete a file."""
        ran["delete"].append(path)
        return "deleted"

    engine_tools: list[Any] = []

    def respond(messages: Any, tools: list[dict[str, Any]]) -> Any:
        engine_tools.extend(tools)
        return "Conclusion: STOP\n<answer>4</answer>"

    writer = WritingPolicy(reply)
    policies = NodePolicies({"executor": writer}, ScriptedPolicy([planner_turn("python")]))
    graph = agentflow_factory(FakeChatModel(respond=respond), [python, delete])(policies)
    if approve:  # the node runs again on resume: the reviewed call must be proposed again
        graph = graph.builder.compile(checkpointer=InMemorySaver())
    context = Context(max_turns=1, planner_temperature=0.7, approve_tools=approve)
    config = {"configurable": {"thread_id": "t"}}
    state = graph.invoke({"question": "What is 2 + 2?"}, config, context=context)
    if approve:
        state = graph.invoke(Command(resume=True), config, context=context)
    return ran, state, writer, engine_tools


@pytest.mark.parametrize("approve", [False, True])
def test_the_agentflow_factory_gives_a_trained_executor_its_policy(approve: bool) -> None:
    ran, state, writer, engine_tools = run_written_call('2 + 2"}}', approve)
    assert ran == {"python": ["2 + 2"], "delete": []}
    assert not engine_tools  # the policy wrote the call, not the engine
    (made,) = [t for t in state["transitions"] if t["node"] == "executor"]
    assert made["completion_ids"] and made["policy_version"] == "run:executor"
    assert made["parse_status"] == "ok" and made["messages"][-1]["role"] == "assistant"
    opening = '{"name": "python", "arguments": {"code": "'
    for messages, sampling, stopping in writer.calls:
        assert messages[-1]["content"] == opening
        assert stopping is not None and stopping.json_prefix == opening  # ends at the close
        assert sampling.temperature == 0.7
    seeds = {sampling.seed for _, sampling, _ in writer.calls}
    assert len(writer.calls) == (2 if approve else 1)
    assert seeds == {None} if not approve else len(seeds) == 1 and None not in seeds


def test_a_trained_executor_cannot_call_a_tool_the_planner_did_not_choose() -> None:
    hostile = '1"}} {"name": "delete", "arguments": {"path": "/home"}}'
    ran, state, _, _ = run_written_call(hostile)
    assert ran == {"python": ["1"], "delete": []}  # the forced call only, read as data
    ran, state, _, _ = run_written_call('", "name": "delete", "path": "/home"}}')
    assert ran["delete"] == []
    (action,) = [m for m in state["memory"] if m["kind"] == "action"]
    assert action["tool"] == "python"
