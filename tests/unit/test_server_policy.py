"""ServerPolicy against a vLLM-shaped stand-in server on 127.0.0.1 that runs the tiny model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from langchain_core.tools import tool
from stand_in_server import Recorded, Reply, stand_in_server

from fakes import FakeChatModel
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.sampling import Sampling
from flowlearn.engine.server import ServerPolicy
from flowlearn.errors import ServerError
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes import token_faithful
from flowlearn.nodes.retry import is_transient
from flowlearn.training import build_flow_grpo_rows
from flowlearn.training.trajectories import trajectory_from_state

MESSAGES = [{"role": "user", "content": "What is 17 * 23? Tool Name: python"}]


class FakeVLLM:
    """Answer /v1/completions and /v1/chat/completions as vLLM does, sampling the tiny model."""

    def __init__(self, policy: HFPolicy, *, ids: bool = True, status: int = 200) -> None:
        self.decoder = BatchingPolicy(policy, max_wait_s=0.0)
        self.ids, self.status = ids, status

    def __call__(self, request: Recorded) -> Reply:
        if self.status != 200:
            return Reply(self.status, {"error": {"message": "model is loading"}})
        body = request.body
        if request.path.endswith("/chat/completions"):
            prompt = self.decoder.encode_chat(body["messages"])
        else:
            prompt = body["prompt"]
        sampling = Sampling(
            temperature=body["temperature"],
            top_p=body["top_p"],
            max_new_tokens=body["max_tokens"],
            seed=body.get("seed"),
        )
        generation = self.decoder.submit(prompt, sampling).result()
        completion, logprobs = generation.completion_ids or [], generation.logprobs or []
        text = generation.text
        tokens = [f"token_id:{i}" for i in completion]
        if request.path.endswith("/chat/completions"):
            choice: dict[str, Any] = {
                "message": {"role": "assistant", "content": text},
                "logprobs": {
                    "content": [
                        {"token": t, "logprob": lp} for t, lp in zip(tokens, logprobs, strict=True)
                    ]
                },
            }
            data: dict[str, Any] = {"choices": [choice]}
            if self.ids:
                choice["token_ids"] = completion
                data["prompt_token_ids"] = prompt
            else:
                choice["logprobs"]["content"] = [{"token": "x", "logprob": lp} for lp in logprobs]
            return Reply(200, data)
        choice = {"text": text, "logprobs": {"tokens": tokens, "token_logprobs": logprobs}}
        if self.ids:
            choice |= {"token_ids": completion, "prompt_token_ids": prompt}
        return Reply(200, {"choices": [choice]})


@pytest.fixture(scope="module")
def policy(tiny_model_dir: Path) -> HFPolicy:
    return HFPolicy.from_pretrained(tiny_model_dir, device="cpu")


@pytest.fixture
def server(policy: HFPolicy) -> Iterator[Any]:
    with stand_in_server(FakeVLLM(policy)) as stand_in:
        yield stand_in


def rescored(policy: HFPolicy, prompt: list[int], completion: list[int], t: float) -> Any:
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / t, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]


@pytest.mark.parametrize("with_tokenizer", [True, False])
def test_server_generations_are_token_faithful(
    policy: HFPolicy,
    server: Any,
    with_tokenizer: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FLOWLEARN_TEST_SERVER_KEY", "sk-test-secret-123")
    remote = ServerPolicy(
        f"{server.url}/v1",
        "tiny",
        tokenizer=policy.tokenizer if with_tokenizer else None,
        api_key_env="FLOWLEARN_TEST_SERVER_KEY",
    )
    gen = remote.generate(MESSAGES, Sampling(temperature=0.7, max_new_tokens=12, seed=5))
    (request,) = server.requests
    assert request.path == ("/v1/completions" if with_tokenizer else "/v1/chat/completions")
    assert request.headers["Authorization"] == "Bearer sk-test-secret-123"
    assert request.body["return_token_ids"] is True and request.body["seed"] == 5
    assert gen.token_faithful and gen.notes == []
    assert gen.prompt_ids == policy.encode_chat(MESSAGES)  # the ids the model read
    assert gen.text == policy.tokenizer.decode(gen.completion_ids, skip_special_tokens=True)
    expected = rescored(policy, gen.prompt_ids, gen.completion_ids, 0.7)
    assert torch.allclose(expected, torch.tensor(gen.logprobs), atol=1e-4)
    assert "sk-test-secret-123" not in repr(gen.__dict__)


def test_a_flow_planned_on_the_server_trains(policy: HFPolicy, server: Any) -> None:
    @tool
    def lookup(query: str) -> str:
        """Look a fact up."""
        return "Paris"

    remote = ServerPolicy(f"{server.url}/v1", "tiny", tokenizer=policy.tokenizer)
    engine = FakeChatModel(default_args={"query": "x"}, text="Conclusion: STOP <answer>x</answer>")
    graph = build_agentflow(remote, engine, [lookup])
    state = graph.invoke(
        {"question": "Capital of France?"},
        context=Context(max_turns=2, planner_max_new_tokens=8, seed=1),
    )
    trajectory = trajectory_from_state(state, trajectory_id="a/0", group_id="a", reference="x")
    trajectory.reward = 1.0
    planner = [t for t in trajectory.transitions if t["node"] == "planner"]
    assert planner and all(token_faithful(t) for t in planner)
    assert build_flow_grpo_rows([trajectory], "paper").rows


def test_without_ids_or_with_raw_logprobs_the_call_is_not_trainable(policy: HFPolicy) -> None:
    with stand_in_server(FakeVLLM(policy, ids=False)) as plain:
        gen = ServerPolicy(f"{plain.url}/v1", "tiny").generate(MESSAGES, Sampling(max_new_tokens=6))
    assert gen.text is not None and not gen.token_faithful
    assert "returned no token ids" in gen.notes[0]
    with stand_in_server(FakeVLLM(policy)) as raw_server:
        raw = ServerPolicy(f"{raw_server.url}/v1", "tiny", logprobs_mode="raw")
        hot = raw.generate(MESSAGES, Sampling(temperature=0.7, max_new_tokens=6))
        cold = raw.generate(MESSAGES, Sampling(temperature=1.0, max_new_tokens=6))
    assert hot.logprobs is None and "--logprobs-mode processed_logprobs" in hot.notes[0]
    assert cold.token_faithful  # at temperature 1 raw and processed agree


@pytest.mark.parametrize(("status", "transient"), [(503, True), (429, True), (400, False)])
def test_server_errors_say_what_happened_and_which_to_retry(
    policy: HFPolicy, status: int, transient: bool
) -> None:
    expected = f"answered {status}: .*model is loading"
    with (
        stand_in_server(FakeVLLM(policy, status=status)) as failing,
        pytest.raises(ServerError, match=expected) as info,
    ):
        ServerPolicy(f"{failing.url}/v1", "tiny").generate(MESSAGES, Sampling())
    assert is_transient(info.value) is transient


def test_bad_settings_are_errors() -> None:
    with pytest.raises(ValueError, match="http:// or https://"):
        ServerPolicy("127.0.0.1:8000", "m")
    with pytest.raises(ValueError, match="logprobs_mode"):
        ServerPolicy("http://127.0.0.1:8000/v1", "m", logprobs_mode="after")  # type: ignore[arg-type]


def test_the_cli_plans_on_a_server(
    tiny_model_dir: Path, server: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flowlearn.cli import main

    out = tmp_path / "runs.jsonl"
    argv = ["run", "What is 17 * 23?", "--planner-url", f"{server.url}/v1"]
    options = ["--engine", str(tiny_model_dir), "--max-turns", "2", "--max-new-tokens", "8"]
    options += ["--engine-max-new-tokens", "8", "--seed", "0", "--save", str(out)]
    assert main([*argv, *options]) == 2  # no served model named
    assert "--planner-url needs --planner" in capsys.readouterr().err
    assert main([*argv, "--planner", str(tiny_model_dir), *options]) == 0
    header = f"planner: {tiny_model_dir}@server at {server.url}/v1 (prompts rendered here)"
    assert header in capsys.readouterr().out
    assert server.requests and all(r.path == "/v1/completions" for r in server.requests)
    assert {r.body["model"] for r in server.requests} == {str(tiny_model_dir)}
    (run,) = [json.loads(line) for line in out.read_text().splitlines()]
    turns = [t for t in run["transitions"] if t["node"] == "planner"]
    assert turns and all(len(t["completion_ids"]) == len(t["logprobs"]) > 0 for t in turns)


def test_a_served_policy_under_node_sampling_is_not_taken_for_a_local_one(
    tiny_model_dir: Path,
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flowlearn.engine.adapters import NodeSampling
    from flowlearn.engine.local import HFPolicy
    from flowlearn.engine.protocol import local_tokenizer, policy_tokenizer
    from flowlearn.engine.server import ServerPolicy

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    served = NodeSampling(ServerPolicy("http://127.0.0.1:9/v1", "m", tokenizer=tokenizer))
    with pytest.raises(AttributeError):  # what a static Protocol check (3.12) would not see
        _ = served.handle
    assert local_tokenizer(served) is None  # the planner and verifier send it no stop watch
    assert policy_tokenizer(served) is tokenizer  # the trained executor's watch decodes with it
    local = NodeSampling(HFPolicy(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer))
    assert local_tokenizer(local) is tokenizer and policy_tokenizer(local) is tokenizer
    assert local_tokenizer(FakeChatModel()) is None and policy_tokenizer(object()) is None
