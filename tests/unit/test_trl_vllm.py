"""Full fine-tuning on TRL's vLLM generation, through its seam: stand-ins of `VLLMGeneration`.

vLLM cannot be installed here; `vllm_stand_in` keeps TRL's interface and samples with a tiny
model, so the ids and logprobs are real. Checked: concurrent planner calls share a generate,
the weights are synced once per optimizer step before the next rollouts, the policy version
advances, the config options, and a 2-process run whose ranks take different turn counts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("trl")

from flow_rows import logprobs
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.import_utils import is_vllm_available
from vllm_job import SAMPLING, train
from vllm_stand_in import StandInClient, StandInVLLMGeneration

from flowlearn.engine.local import chat_prompt_ids
from flowlearn.nodes import Sampling, policy_transition
from flowlearn.training import TrajectoryStore
from flowlearn.training.config import FlowParser, parse_config
from flowlearn.training.rows import check_sampling
from flowlearn.training.vllm.trl_engine import PerRankServer, VLLMPolicy


def loaded(folder: Path) -> tuple[Any, Any]:
    return AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)


def concurrently(calls: list[Any]) -> list[Any]:
    """Run the calls on threads that start together; return results (or errors) in order."""
    results: list[Any] = [None] * len(calls)
    start = threading.Barrier(len(calls))

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = calls[index]()
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def generate_sizes(events: list[Any]) -> list[int]:
    return [size for kind, size in events if kind == "generate"]


def test_vllm_policy_batches_concurrent_calls_with_the_sampling_logprobs(
    tiny_model_dir: Path,
) -> None:
    model, tokenizer = loaded(tiny_model_dir)
    engine = StandInVLLMGeneration(model, None, tokenizer)
    engine.sync_weights()
    policy = VLLMPolicy(engine, tokenizer, "run@3", max_batch_size=8, max_wait_s=0.3)
    chats = [[{"role": "user", "content": f"What is {i} * 23? Tool:"}] for i in range(6)]
    hot = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=6)
    calls = [lambda m=m: policy.generate(m, SAMPLING) for m in chats]
    results = concurrently([*calls, lambda: policy.generate(chats[0], hot)])
    assert not [r for r in results if isinstance(r, Exception)], results
    sizes = generate_sizes(engine.events)
    assert sum(sizes) == 7 and max(sizes) > 1, sizes  # batched; other sampling, other call
    for chat, generation in zip([*chats, chats[0]], results, strict=True):
        assert generation.token_faithful and generation.policy_version == "run@3"
        assert generation.prompt_ids == chat_prompt_ids(tokenizer, chat)
        assert generation.sampling["logprobs_mode"] == "processed"
        temperature = generation.sampling["temperature"]
        expected = logprobs(model, generation.prompt_ids, generation.completion_ids)
        if temperature == SAMPLING.temperature:  # flow_rows scores at 0.7
            assert generation.logprobs == pytest.approx(expected, abs=1e-4)
        record = policy_transition("planner", 1, chat, generation)
        check_sampling(record, Sampling(temperature=temperature))  # provenance accepts it


def test_vllm_policy_fails_alone_the_call_that_does_not_fit(tiny_model_dir: Path) -> None:
    model, tokenizer = loaded(tiny_model_dir)
    engine = StandInVLLMGeneration(model, None, tokenizer)
    policy = VLLMPolicy(engine, tokenizer, "v", max_wait_s=0.2, context_window=40)
    short = [{"role": "user", "content": "Tool?"}]
    long = [{"role": "user", "content": "What is 17 * 23? " * 20}]
    results = concurrently(
        [lambda: policy.generate(short, SAMPLING)] * 2 + [lambda: policy.generate(long, SAMPLING)]
    )
    assert [isinstance(r, ValueError) for r in results] == [False, False, True]
    assert "does not fit vLLM's 40-token window" in str(results[2])
    assert generate_sizes(engine.events) == [2]


def test_vllm_training_syncs_weights_once_per_step_before_the_rollouts(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    seen = train(tiny_model_dir, tmp_path, "colocate", turns=2, rollouts=4)
    events = seen["events"]
    kinds = [kind for i, (kind, _) in enumerate(events) if i == 0 or events[i - 1][0] != kind]
    assert kinds == ["initial", "sync", "generate", "step", "sync", "generate", "step"]
    value = {kind: [v for k, v in events if k == kind] for kind in ("initial", "sync", "step")}
    assert value["sync"][0] == value["initial"][0]  # the first rollouts: the weights as loaded
    assert value["sync"][1] == value["step"][0] != value["initial"][0]  # then update 1's
    assert seen["syncs"] == 2
    assert max(generate_sizes(events)) > 1  # 4 flows in flight share generate calls
    rollouts = TrajectoryStore(tmp_path / "colocate" / "rollouts.jsonl").load()
    versions = {
        r.trajectory_id.split(":")[0]: {t["policy_version"] for t in r.transitions}
        for r in rollouts
    }
    out = str(tmp_path / "colocate")
    assert versions == {"step0": {f"{out}@0"}, "step1": {f"{out}@1"}}
    assert {len(r.transitions) for r in rollouts} == {2} and len(rollouts) == 8
    for log in seen["logs"]:  # rollouts sampled on synced weights: TRL's ratio is 1
        assert log["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0, abs=1e-3)
        assert log["flow/old_logprob_gap"] < 1e-4


def test_vllm_server_mode_generates_through_the_rank_client(tiny_model_dir: Path) -> None:
    model, tokenizer = loaded(tiny_model_dir)
    generation = StandInVLLMGeneration(model, None, tokenizer, mode="server")
    generation.vllm_client = StandInClient(generation)  # type: ignore[attr-defined]
    server = PerRankServer.of(generation, SimpleNamespace(is_main_process=True), 0.7)
    assert (server.logprobs_mode, server.max_model_length) == ("processed", 8192)
    server.sync_weights()
    policy = VLLMPolicy(server, tokenizer, "v", max_wait_s=0.3)
    chat = [{"role": "user", "content": "Tool?"}]
    results = concurrently([lambda: policy.generate(chat, SAMPLING)] * 3)
    assert all(r.token_faithful for r in results), results
    assert generation.vllm_client.requests == [  # type: ignore[attr-defined]
        {"prompts": 3, "temperature": 0.7, "top_p": 1.0}
    ]
    generation.vllm_client = StandInClient(generation, "processed_logits")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="--logprobs-mode processed_logprobs"):
        PerRankServer.of(generation, SimpleNamespace(is_main_process=True), 0.7)


def test_vllm_options_in_yaml_flags_and_help(tiny_model_dir: Path, tmp_path: Path) -> None:
    yaml = tmp_path / "train.yaml"
    yaml.write_text(f"planner: {tiny_model_dir}\nbenchmark: gameof24\nuse_vllm: true\n")
    config = parse_config(["--config", str(yaml), "--vllm_mode", "server"])
    assert (config.use_vllm, config.vllm_mode, config.lora) == (True, "server", False)
    flags = parse_config(["--planner", str(tiny_model_dir), "--data", "x.jsonl", "--use_vllm"])
    assert (flags.use_vllm, flags.vllm_mode) == (True, "colocate")
    text = FlowParser().format_help()
    assert "--use_vllm" in text and "--vllm_mode" in text


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--use_vllm", "--vllm_mode", "both"], "vllm_mode must be one of 'colocate', 'server'"),
        (["--vllm_mode", "server"], "has no effect without use_vllm"),
        (["--use_vllm", "--planner", "m.gguf"], "a .gguf file"),
        (["--use_vllm"], "the default planner is one"),
        (["--use_vllm", "--lora", "true", "@"], "/v1/load_lora_adapter"),
        (["--use_vllm", "--top_p", "0.9", "@"], "sample with top_p 1"),
        (["--use_vllm", "--vllm_tensor_parallel_size", "2", "@"], "a deadlock"),
        (["--use_vllm", "--vllm_enable_sleep_mode", "true", "@"], "turn it off"),
        (["--use_vllm", "--engine", "base", "@"], "frozen base under LoRA"),
    ],
)
def test_vllm_contradictions_are_errors(
    options: list[str], message: str, tiny_model_dir: Path
) -> None:
    if options[-1] == "@":  # a planner vLLM can load, so the option itself is refused
        options = [*options[:-1], "--planner", str(tiny_model_dir)]
    with pytest.raises(ValueError, match=message):
        parse_config(["--benchmark", "gameof24", *options])


def test_vllm_off_or_offline_refuses_an_engine_factory(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from flow_rows import toy_config, toy_trajectories
    from vllm_job import stand_in_factory

    from flowlearn.training.trainer import FlowGRPOTrainer

    model, tokenizer = loaded(tiny_model_dir)
    for use_vllm, message in ((False, "use_vllm is off"), (True, "offline training")):
        with pytest.raises(ValueError, match=message):
            FlowGRPOTrainer.offline(
                model,
                args=toy_config(tmp_path, use_vllm=use_vllm),
                trajectories=toy_trajectories(model),
                processing_class=tokenizer,
                vllm=stand_in_factory("colocate", []),
            )


@pytest.mark.slow
def test_vllm_two_processes_with_different_turn_counts_finish(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from test_accelerate import ENV, LAUNCH

    job = Path(__file__).parents[1] / "vllm_job.py"
    launched = subprocess.Popen(
        [*LAUNCH, str(job), str(tiny_model_dir), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,  # its own process group: a hang is ended whole
    )
    try:
        _, err = launched.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        os.killpg(launched.pid, signal.SIGKILL)
        launched.communicate()
        pytest.fail("the 2-process vLLM run did not finish in 600 s: a collective deadlocked")
    assert launched.returncode == 0, err[-3000:]
    for mode in ("colocate", "server"):
        seen = [json.loads((tmp_path / f"{mode}.{r}.json").read_text()) for r in (0, 1)]
        assert [s["syncs"] for s in seen] == [2, 2], mode
        calls = [len(generate_sizes(s["events"])) for s in seen]
        assert calls[0] > calls[1] >= 2, (mode, calls)  # the ranks really diverged
        store = tmp_path / mode
        for rank, turns in ((0, 3), (1, 1)):
            name = "rollouts.jsonl" if rank == 0 else "rollouts.rank1.jsonl"
            rollouts = TrajectoryStore(store / name).load()
            assert len(rollouts) == 4 and {len(r.transitions) for r in rollouts} == {turns}


class HalfScored:
    """An engine whose second completion lacks a logprob (vLLM's NaN becomes None in TRL)."""

    temperature, top_p, max_completion_length = 1.0, 1.0, 16
    generation_kwargs: dict[str, Any] = {}  # noqa: RUF012

    def generate(
        self, prompts: Any, images: Any, num_generations: int, profiler: Any = None
    ) -> Any:
        completions = [[5, 6] for _ in prompts]
        scores = [[[-0.5], [-0.25]], [[-0.5], [None]]][: len(prompts)]
        return prompts, completions, scores, completions

    def sync_weights(self) -> None:
        """Nothing to push: the outputs are fixed."""


def test_vllm_policy_fails_alone_a_completion_without_logprobs(tiny_model_dir: Path) -> None:
    _, tokenizer = loaded(tiny_model_dir)
    policy = VLLMPolicy(HalfScored(), tokenizer, "v", max_wait_s=0.3)
    chat = [{"role": "user", "content": "Tool?"}]
    results = concurrently([lambda: policy.generate(chat, SAMPLING)] * 2)
    failed = [r for r in results if isinstance(r, ValueError)]
    done = [r for r in results if not isinstance(r, Exception)]
    assert len(failed) == len(done) == 1 and "no logprob" in str(failed[0])
    assert done[0].logprobs == [-0.5, -0.25] and done[0].completion_ids == [5, 6]


@pytest.mark.skipif(is_vllm_available(), reason="vLLM is installed")
def test_vllm_missing_is_a_usage_error_before_any_model_loads(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from flowlearn.compose import build_training_parts
    from flowlearn.flow_setup import UsageError

    data = tmp_path / "cases.jsonl"
    data.write_text(json.dumps({"id": "q", "query": "What is 1 + 1?", "reference": "2"}) + "\n")
    config = parse_config(["--data", str(data), "--use_vllm", "--planner", str(tiny_model_dir)])
    with pytest.raises(UsageError, match="use_vllm needs vLLM"):
        build_training_parts(config)


def test_vllm_a_users_graph_samples_every_call_on_trls_engine(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    import copy

    from langchain_core.messages import HumanMessage
    from langgraph.graph import END, START, MessagesState, StateGraph
    from vllm_job import config, stand_in_factory

    from flowlearn.evals.cases import Case
    from flowlearn.evals.scorers import Score
    from flowlearn.graphs import Context
    from flowlearn.graphs.trainable import trainable_graph
    from flowlearn.training.trainer import FlowGRPOTrainer

    def app(model: Any) -> Any:  # a user's two nodes, no flowlearn node in it
        def call(node: str) -> Any:
            return lambda s: {"messages": [model.invoke([*s["messages"], HumanMessage(node)])]}

        graph = StateGraph(MessagesState)
        graph.add_node("router", call("router"))
        graph.add_node("writer", call("writer"))
        graph.add_edge(START, "router")
        graph.add_edge("router", "writer")
        graph.add_edge("writer", END)
        return graph.compile()

    def length(answer: str, case: Case) -> Score:
        return Score(min(len(answer), 30) / 30, "length")

    model, tokenizer = loaded(tiny_model_dir)
    before = copy.deepcopy(model)  # the weights step 0's rollouts sample from
    events: list[Any] = []
    out = tmp_path / "colocate"
    store = TrajectoryStore(out / "rollouts.jsonl")
    trainer = FlowGRPOTrainer.online(
        model,
        args=config(out, "colocate", rollouts=4),
        graph_factory=trainable_graph(app),
        scorer=length,
        cases=[Case(f"q{i}", f"What is {i} + {i}?", "") for i in range(4)],
        context=Context(planner_temperature=SAMPLING.temperature, planner_max_new_tokens=6),
        processing_class=tokenizer,
        rollout_store=store,
        vllm=stand_in_factory("colocate", events),
    )
    trainer.train()
    assert [kind for kind, _ in events if kind == "sync"] == ["sync", "sync"]  # once a step
    assert sum(generate_sizes(events)) == 16  # 2 steps x 4 rollouts x 2 calls, all on vLLM
    checked = 0
    for rollout in store.load():
        step = rollout.trajectory_id.split(":")[0].removeprefix("step")
        assert [(t["node"], t["policy_version"]) for t in rollout.transitions] == [
            ("router", f"{out}@{step}"),
            ("writer", f"{out}@{step}"),
        ]
        for call in rollout.transitions if step == "0" else []:  # the engine's exact tokens
            assert call["prompt_ids"] == chat_prompt_ids(tokenizer, call["messages"])
            expected = logprobs(before, call["prompt_ids"], call["completion_ids"])
            assert call["logprobs"] == pytest.approx(expected, abs=1e-4)
            checked += 1
    assert checked == 8  # step 0: 4 rollouts x 2 calls
