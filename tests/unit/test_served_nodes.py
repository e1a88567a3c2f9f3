"""Several trained nodes on a vLLM-shaped stand-in server: an adapter per node pushed each step,
each node's requests naming its own, the others the served base, stale rows corrected per node."""

from __future__ import annotations

import copy
import itertools
import json
import operator
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("trl")
pytest.importorskip("peft")

import torch
from langchain_core.messages import HumanMessage
from langgraph.graph import END, START, MessagesState, StateGraph
from lora_server_stand_in import StandInLoraServer
from peft import LoraConfig
from stand_in_server import Reply, stand_in_server
from trainer_setup import config
from transformers import AutoModelForCausalLM, AutoTokenizer

from flowlearn.cli import main
from flowlearn.engine.adapters import NodePolicies, active_adapter
from flowlearn.engine.local import tuned_parts
from flowlearn.engine.sampling import Sampling
from flowlearn.engine.server import ServerPolicy
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context
from flowlearn.graphs.trainable import trainable_graph
from flowlearn.nodes import policy_transition
from flowlearn.training import TrajectoryStore
from flowlearn.training.config import parse_config
from flowlearn.training.roles import TrainedRoles, with_node_adapters
from flowlearn.training.rows import FlowGRPORow
from flowlearn.training.trainer import FlowGRPOTrainer
from flowlearn.training.vllm.lora_server import (
    AdapterError,
    AdapterServer,
    ServerGeneration,
    adapter_name,
    served_base_name,
)

NODES = ("planner", "verifier")


def two_adapters(tiny_model_dir: Path, nodes: tuple[str, ...] = NODES) -> Any:
    """The tiny model with an adapter per node (the planner's and the verifier's) that differ
    (B matrices non-zero)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    peft_model = with_node_adapters(model, {n: settings for n in nodes})
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    return peft_model.eval()


class Trainer:
    """What `ServerGeneration` reads of a `FlowGRPOTrainer`, and a forward that records the
    adapter it ran under (`correct_stale_rows`)."""

    def __init__(self, model: Any, tokenizer: Any, step: int = 0) -> None:
        self.model = model
        self.processing_class = tokenizer
        self.roles = TrainedRoles(NODES, adapters=True)
        self.source = SimpleNamespace(run_id="r")
        self.state = SimpleNamespace(global_step=step)
        self.accelerator = SimpleNamespace(
            is_main_process=True, unwrap_model=lambda m: m, device="cpu"
        )
        self.args = SimpleNamespace(per_device_train_batch_size=8)
        self._metrics: dict[str, Any] = {"train": defaultdict(list)}
        self.scored: list[tuple[list[str], list[list[int]]]] = []

    def _get_per_token_logps_and_entropies(
        self, model: Any, ids: Any, mask: Any, keep: int, *, batch_size: int
    ) -> tuple[Any, None, None]:
        layers, _ = tuned_parts(model)
        self.scored.append((list(layers[0].active_adapters), ids[:, -keep:].tolist()))
        return torch.full((ids.size(0), keep), -0.5), None, None


@pytest.fixture
def vllm(tiny_model_dir: Path) -> Iterator[StandInLoraServer]:
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    served = StandInLoraServer(base, AutoTokenizer.from_pretrained(tiny_model_dir))
    yield served
    served.close()


def scored_under(model: Any, node: str, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """The completion's logprobs under `node`'s adapter in this process (temperature 1)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad(), active_adapter(model, node):
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def test_served_nodes_push_an_adapter_per_node_keep_two_each_and_name_the_base(
    tiny_model_dir: Path, tmp_path: Path, vllm: StandInLoraServer
) -> None:
    model, tokenizer = two_adapters(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    trainer = Trainer(model, tokenizer)
    with stand_in_server(vllm) as server:
        generation = ServerGeneration.at(f"{server.url}/v1", tmp_path / "adapters")
        generation.server.api_key_env = None
        for step in range(3):
            trainer.state.global_step = step
            policy = generation.live_policy(trainer, model)
            again = generation.live_policy(trainer, model)  # the same step: nothing pushed
            assert again["planner"] is policy["planner"] and again.base is policy.base
        names = {node: adapter_name("r", 2, node) for node in NODES}
        assert isinstance(policy, NodePolicies) and set(policy) == set(NODES)
        for node in NODES:
            served = policy[node]
            assert isinstance(served, ServerPolicy)
            assert (served.model, served.version) == (names[node], names[node])
        assert isinstance(policy.base, ServerPolicy) and policy.base.model == "base"
        assert policy.for_node("executor") is policy.base  # untrained: every adapter off
        # Each node's requests name its adapter, and the server samples its node's weights.
        prompt = tokenizer("The sky is").input_ids
        sampling = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=6, seed=0)
        for node in NODES:
            out = policy[node].generate([{"role": "user", "content": "The sky is"}], sampling)
            assert vllm.models_named[-1] == names[node] and out.policy_version == names[node]
            prompt, completion = out.prompt_ids or [], out.completion_ids or []
            own = scored_under(model, node, prompt, completion)
            other = scored_under(model, next(n for n in NODES if n != node), prompt, completion)
            assert torch.allclose(torch.tensor(out.logprobs), own, atol=1e-4)
            assert not torch.allclose(torch.tensor(out.logprobs), other, atol=1e-2)
        out = policy.for_node("executor").generate([{"role": "user", "content": "Hi"}], sampling)
        assert vllm.models_named[-1] == "base" and out.policy_version == "base@server"
        gets = [r.path for r in server.requests if r.method == "GET"]
        for served in policy.values():
            served.close()
        policy.base.close()
    assert gets == ["/v1/models"]  # asked once, before the first push
    loaded = [load.name for load in vllm.loads]
    assert loaded == [adapter_name("r", s, n) for s in range(3) for n in NODES]
    for load in vllm.loads:  # PEFT writes a named adapter into a folder of its name
        node = load.name.rsplit("-", 1)[1]
        assert Path(load.path) == (tmp_path / "adapters" / load.name / node).resolve()
        assert {"adapter_config.json", "adapter_model.safetensors"} <= set(load.files)
    # keep=2 counts per node: step 0's adapters of both nodes go at step 2, none earlier.
    assert vllm.unloads == [adapter_name("r", 0, n) for n in NODES]
    assert vllm.events.index(f"unload:{adapter_name('r', 0, 'planner')}") > vllm.events.index(
        f"load:{adapter_name('r', 2, 'planner')}"
    )
    held = sorted(p.name for p in (tmp_path / "adapters").iterdir())
    assert held == sorted(adapter_name("r", s, n) for s in (1, 2) for n in NODES)
    assert sorted(generation.server.loaded) == held


def test_served_nodes_base_is_the_engines_name_or_the_servers_else_refused(
    tiny_model_dir: Path, tmp_path: Path, vllm: StandInLoraServer
) -> None:
    url = "http://127.0.0.1:8000/v1"
    assert served_base_name(url, url + "/", "Qwen/Qwen2.5-7B-Instruct") == (
        "Qwen/Qwen2.5-7B-Instruct"
    )
    assert served_base_name(url, "http://other:8000/v1", "m") is None
    assert served_base_name(url, None, "base") is None
    model, tokenizer = two_adapters(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)
    with stand_in_server(vllm) as server:
        named = ServerGeneration.at(f"{server.url}/v1", tmp_path / "a", base="base")
        named.server.api_key_env = None
        policy = named.live_policy(Trainer(model, tokenizer), model)
        assert isinstance(policy, NodePolicies) and policy.base.model == "base"
        assert not [r for r in server.requests if r.method == "GET"]  # named: not asked
        vllm.models_reply = Reply(404, {"detail": "Not Found"})
        asked = ServerGeneration.at(f"{server.url}/v1", tmp_path / "b")
        asked.server.api_key_env = None
        loads = len(vllm.loads)
        with pytest.raises(AdapterError, match=r"does not name one base model.*engine_url"):
            asked.live_policy(Trainer(model, tokenizer, step=1), model)
        assert len(vllm.loads) == loads  # refused before any adapter was loaded
    listings = {
        "a": [
            {"id": "a", "root": "/m", "parent": None},
            {"id": "b", "root": "/m"},  # `--served-model-name a b`: one model, two names
            {"id": "flow-x", "root": "/p", "parent": "a"},
        ],
        None: [{"id": "a", "root": "/m"}, {"id": "c", "root": "/other"}],
    }
    for expected, cards in listings.items():
        with stand_in_server(lambda r, cards=cards: Reply(200, {"data": cards})) as server:
            adapters = AdapterServer(f"{server.url}/v1", tmp_path, api_key_env=None)
            if expected is None:
                with pytest.raises(AdapterError, match=r"'c'.*served name"):
                    adapters.served_base()
            else:
                assert adapters.served_base() == expected


def row(node: str, version: str, completion: list[int]) -> FlowGRPORow:
    sampled = [-1.0] * len(completion)
    return FlowGRPORow(
        "t", "g", 1, [1, 2], completion, sampled, 2.0, 1.0, 1.0, node=node, policy_version=version
    )


def test_served_nodes_stale_rows_are_corrected_under_their_nodes_adapter(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    model = two_adapters(tiny_model_dir)
    trainer = Trainer(model, AutoTokenizer.from_pretrained(tiny_model_dir), step=1)
    generation = ServerGeneration(AdapterServer("http://h:1/v1", tmp_path, api_key_env=None))
    now = {node: adapter_name("r", 1, node) for node in NODES}
    rows = [
        row("planner", now["planner"], [5]),  # the planner's current adapter: not stale
        row("verifier", now["planner"], [6]),  # another node's adapter sampled it: stale
        row("planner", adapter_name("r", 0, "planner"), [7, 8]),  # an older planner: stale
        row("verifier", now["verifier"], [9]),
        row("verifier", adapter_name("r", 0, "verifier"), [10]),
    ]
    generation.correct(trainer, rows)
    # Scored once per node (in the order their first stale row comes), each under its own
    # adapter, the stale rows only.
    assert trainer.scored == [(["verifier"], [[6], [10]]), (["planner"], [[7, 8]])]
    assert [r.token_scales is not None for r in rows] == [False, True, True, False, True]
    assert rows[2].old_logprobs == [-0.5, -0.5] and rows[0].old_logprobs == [-1.0]
    assert trainer._metrics["train"]["flow/stale_rows"] == [3.0]
    assert len(trainer._metrics["train"]["flow/stale_is_ratio"]) == 1
    layers, _ = tuned_parts(model)
    assert list(layers[0].active_adapters) == ["planner"]  # switched back after


class ChainState(TypedDict, total=False):
    question: str
    answer: str
    transitions: Annotated[list[Any], operator.add]


def chain(policies: NodePolicies) -> Any:
    """A planner, a verifier and a critic, one call each: the first two train, the critic not."""

    def call(node: str) -> Any:
        def run(state: ChainState) -> dict[str, Any]:
            messages = [{"role": "user", "content": f"{node}: {state['question']}"}]
            sampling = Sampling(temperature=0.7, top_p=1.0, max_new_tokens=6)
            generation = policies.for_node(node).generate(messages, sampling)
            record = policy_transition(node, 1, messages, generation)
            return {"answer": generation.text, "transitions": [record]}

        return run

    graph = StateGraph(ChainState)
    previous = START
    for node in ("planner", "verifier", "critic"):
        graph.add_node(node, call(node))
        graph.add_edge(previous, node)
        previous = node
    graph.add_edge(previous, END)
    return graph.compile()


def test_served_nodes_each_nodes_requests_name_its_adapter_while_training(
    tiny_model_dir: Path, tmp_path: Path, vllm: StandInLoraServer
) -> None:
    counts: dict[str, Iterator[int]] = defaultdict(itertools.count)

    def alternating(answer: str, case: Case) -> Score:  # every group has a signal: 1, 0, ...
        return Score(float(next(counts[case.id]) % 2 == 0), "alternating")

    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    with stand_in_server(vllm) as server:
        url = f"{server.url}/v1"
        trainer = FlowGRPOTrainer.online(
            two_adapters(tiny_model_dir),
            args=config(tmp_path, per_device_train_batch_size=4, max_completion_length=6),
            graph_factory=chain,
            scorer=alternating,
            cases=[Case(str(i), f"Capital {i}?", "paris") for i in range(2)],
            context=Context(max_turns=1, planner_temperature=0.7, planner_max_new_tokens=6),
            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
            rollout_store=store,
            nodes=list(NODES),
            server=ServerGeneration.at(url, tmp_path / "adapters"),
        )
        trainer.source.run_id = "r"
        trainer.train()
    names = [{n: adapter_name("r", step, n) for n in NODES} for step in (0, 1)]
    assert [load.name for load in vllm.loads] == [s[n] for s in names for n in NODES]
    # Step k's requests name step k's adapters, and the critic the served base.
    second = vllm.events.index(f"load:{names[1]['planner']}")
    for step, events in enumerate((vllm.events[:second], vllm.events[second:])):
        completes = {e for e in events if e.startswith("complete:")}
        assert completes == {*(f"complete:{names[step][n]}" for n in NODES), "complete:base"}
    versions: dict[tuple[str, str], set[str]] = defaultdict(set)
    for rollout in store.load():
        step = rollout.trajectory_id.split(":")[0]
        for call in rollout.transitions:
            versions[(call["node"], step)].add(str(call["policy_version"]))
    assert dict(versions) == {
        **{(n, f"step{k}"): {names[k][n]} for k in (0, 1) for n in NODES},
        **{("critic", f"step{k}"): {"base@server"} for k in (0, 1)},
    }
    logged = [h for h in trainer.state.log_history if "flow/stale_rows" in h]
    assert [h["flow/stale_rows"] for h in logged] == [0.0, 0.0]
    assert all(h["flow/planner/rows"] == h["flow/verifier/rows"] == 4.0 for h in logged)


def users_app(model: Any) -> Any:
    """A user's LangGraph app, no flowlearn node in it: a router, a writer and a critic."""

    def call(node: str) -> Any:
        def run(state: MessagesState) -> dict[str, Any]:
            return {"messages": [model.invoke([*state["messages"], HumanMessage(f"{node}:")])]}

        return run

    graph = StateGraph(MessagesState)
    previous = START
    for node in ("router", "writer", "critic"):
        graph.add_node(node, call(node))
        graph.add_edge(previous, node)
        previous = node
    graph.add_edge(previous, END)
    return graph.compile()


def test_served_nodes_a_users_graph_samples_each_node_under_its_adapter_token_exact(
    tiny_model_dir: Path, tmp_path: Path, vllm: StandInLoraServer
) -> None:
    trained = ("router", "writer")
    model = two_adapters(tiny_model_dir, trained)
    before = copy.deepcopy(model)  # the weights step 0's adapters hold
    store = TrajectoryStore(tmp_path / "rollouts.jsonl")
    counts: dict[str, Iterator[int]] = defaultdict(itertools.count)

    def alternating(answer: str, case: Case) -> Score:  # every group has a signal: 1, 0, ...
        return Score(float(next(counts[case.id]) % 2 == 0), "alternating")

    with stand_in_server(vllm) as server:
        trainer = FlowGRPOTrainer.online(
            model,
            args=config(tmp_path, per_device_train_batch_size=4, max_completion_length=6),
            graph_factory=trainable_graph(users_app),
            scorer=alternating,
            cases=[Case(str(i), f"Capital {i}?", "paris") for i in range(2)],
            context=Context(planner_temperature=0.7, planner_max_new_tokens=6),
            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
            rollout_store=store,
            nodes=list(trained),
            server=ServerGeneration.at(f"{server.url}/v1", tmp_path / "adapters"),
        )
        trainer.source.run_id = "r"
        trainer.train()
    names = [{n: adapter_name("r", step, n) for n in trained} for step in (0, 1)]
    assert [load.name for load in vllm.loads] == [s[n] for s in names for n in trained]
    second = vllm.events.index(f"load:{names[1]['router']}")
    for step, events in enumerate((vllm.events[:second], vllm.events[second:])):
        completes = {e for e in events if e.startswith("complete:")}
        assert completes == {*(f"complete:{names[step][n]}" for n in trained), "complete:base"}
    sent = [r.body["prompt"] for r in server.requests if r.path == "/v1/completions"]
    rollouts, checked = store.load(), 0
    calls = [c for r in rollouts for c in r.transitions]
    assert sorted(map(tuple, sent)) == sorted(tuple(c["prompt_ids"]) for c in calls)
    for rollout in rollouts:
        step = int(rollout.trajectory_id.split(":")[0].removeprefix("step"))
        assert [(c["node"], c["policy_version"]) for c in rollout.transitions] == [
            ("router", names[step]["router"]),
            ("writer", names[step]["writer"]),
            ("critic", "base@server"),  # not trained: the served base, every adapter off
        ]
        if step == 0:  # the served tokens and logprobs are the adapter's own, at 0.7
            for call in rollout.transitions[:2]:
                prompt, completion = call["prompt_ids"], call["completion_ids"]
                ids = torch.tensor([prompt + completion])
                with torch.no_grad(), active_adapter(before, call["node"]):
                    logits = before(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
                own = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])
                assert torch.allclose(torch.tensor(call["logprobs"]), own[:, 0], atol=1e-4)
                checked += 1
    assert checked == 8  # step 0: 2 questions x 2 rollouts x 2 trained calls
    logged = [h for h in trainer.state.log_history if "flow/stale_rows" in h]
    assert [h["flow/stale_rows"] for h in logged] == [0.0, 0.0]
    assert all(h["flow/router/rows"] == h["flow/writer/rows"] == 4.0 for h in logged)


def test_served_nodes_trls_shape_trains_a_users_graph_on_planner_url(
    tiny_model_dir: Path, tmp_path: Path, vllm: StandInLoraServer
) -> None:
    from flowlearn.training.config import FlowGRPOConfig

    def odd_length(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(c) % 2) for c in completions]

    trained = ("router", "writer")
    with stand_in_server(vllm) as server:
        trainer = FlowGRPOTrainer(
            model=two_adapters(tiny_model_dir, trained),
            reward_funcs=[odd_length],
            args=FlowGRPOConfig(
                output_dir=str(tmp_path / "out"),
                report_to="none",
                max_steps=1,
                questions_per_step=2,
                num_generations=2,
                max_completion_length=6,
                save_strategy="no",
                bf16=False,
                use_cpu=True,
                train_nodes=list(trained),
                planner_url=f"{server.url}/v1",
            ),
            train_dataset=[{"question": f"Capital {i}?", "answer": "paris"} for i in range(2)],
            graph_factory=trainable_graph(users_app),
            processing_class=AutoTokenizer.from_pretrained(tiny_model_dir),
        )
        trainer.train()
    assert server.requests[0].path == "/v1/models"  # the base's served name, asked first
    names = {n: adapter_name(trainer.source.run_id, 0, n) for n in trained}
    assert [load.name for load in vllm.loads] == list(names.values())
    assert all(Path(load.path).is_relative_to(tmp_path / "out" / "adapters") for load in vllm.loads)
    completes = {e for e in vllm.events if e.startswith("complete:")}
    assert completes == {*(f"complete:{name}" for name in names.values()), "complete:base"}
    (logged,) = [h for h in trainer.state.log_history if "flow/router/rows" in h]
    assert logged["flow/router/rows"] == logged["flow/writer/rows"] == 4.0


@pytest.mark.slow
def test_served_nodes_flowlearn_train_pushes_both_nodes_adapters(
    tiny_model_dir: Path, tmp_path: Path, vllm: StandInLoraServer
) -> None:
    out = tmp_path / "out"
    with stand_in_server(vllm) as server:
        flags = [
            "--planner", str(tiny_model_dir), "--benchmark", "gameof24", "--limit", "2",
            "--num_generations", "2", "--questions-per-step", "1", "--max-turns", "1",
            "--max_completion_length", "8", "--engine-max-new-tokens", "8", "--max-steps", "2",
            "--engine", "base", "--train_nodes", "planner,verifier", "--bf16", "false",
            "--output-dir", str(out), "--planner_url", f"{server.url}/v1",
        ]  # fmt: skip
        assert main(["train", *flags]) == 0
    assert server.requests[0].path == "/v1/models"  # the base's name, before any push
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    names = [{n: adapter_name(run_id, step, n) for n in NODES} for step in (0, 1)]
    assert [load.name for load in vllm.loads] == [s[n] for s in names for n in NODES]
    # The tiny planner's turns do not parse, so the verifier is never reached here: its
    # requests are checked above, on a graph that calls it.
    second = vllm.events.index(f"load:{names[1]['planner']}")
    for step, events in enumerate((vllm.events[:second], vllm.events[second:])):
        assert {e for e in events if e.startswith("complete:")} == {
            f"complete:{names[step]['planner']}"
        }
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["flow/stale_rows"] for r in records] == [0.0, 0.0]
    for node in NODES:
        assert (out / "final" / node / "adapter_model.safetensors").is_file()


def test_served_nodes_config_takes_planner_url_and_still_refuses_use_vllm() -> None:
    base = ["--benchmark", "gameof24", "--train_nodes", "planner,verifier"]
    config = parse_config([*base, "--planner_url", "http://h:8000/v1"])
    assert (config.planner_url, config.train_nodes, config.lora) == (
        "http://h:8000/v1",
        list(NODES),
        True,
    )
    with pytest.raises(ValueError, match=r"use_vllm with train_nodes.*not supported yet"):
        parse_config([*base, "--use_vllm", "true"])
    top_p = '{"verifier": {"top_p": 0.9}}'
    with pytest.raises(
        ValueError, match=r"node_settings\['verifier'\]\['top_p'\] 0.9 with planner"
    ):
        parse_config([*base, "--planner_url", "http://h:8000/v1", "--node_settings", top_p])
    assert parse_config([*base, "--node_settings", top_p]).planner_url is None  # local: fine
