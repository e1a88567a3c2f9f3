"""The fixed engine on a vLLM-shaped stand-in server: the same replies as the local engine."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from lora_server_stand_in import StandInLoraServer
from stand_in_server import stand_in_server
from transformers import AutoModelForCausalLM, AutoTokenizer

from flowlearn.cli import main
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.chat import HFChatModel, ServerChatModel
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.server import ServerPolicy
from flowlearn.engine.stops import RepetitionRule, StopWatch

ASK = [HumanMessage("What is the capital of Kenya? Answer with a tool.")]


@tool
def lookup(query: str) -> str:
    """Look up a fact."""
    return "Nairobi"


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[StandInLoraServer, str]]:
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    stand_in = StandInLoraServer(model, tokenizer, base_name=str(tiny_model_dir))
    with stand_in_server(stand_in) as server:
        yield stand_in, f"{server.url}/v1"
    stand_in.close()


def engines(tiny_model_dir: Path, url: str) -> tuple[HFChatModel, ServerChatModel]:
    """The local engine and the served one, decoding alike (the stand-in batches as here)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    local = HFChatModel(policy=BatchingPolicy(HFPolicy(model, tokenizer), max_wait_s=0.0))
    server = ServerPolicy(url, str(tiny_model_dir), tokenizer=tokenizer, api_key_env=None)
    return local, ServerChatModel(policy=server)


def test_vllm_engine_server_replies_as_the_local_engine(
    tiny_model_dir: Path, served: tuple[StandInLoraServer, str]
) -> None:
    stand_in, url = served
    local, remote = engines(tiny_model_dir, url)
    mine = local.invoke(ASK, max_tokens=24)
    theirs = remote.invoke(ASK, max_tokens=24)
    assert theirs.text == mine.text and len(mine.text) > 8
    meta = theirs.response_metadata
    assert meta["completion_ids"] == mine.response_metadata["completion_ids"]
    assert meta["prompt_ids"] == mine.response_metadata["prompt_ids"]  # rendered here, as ids
    assert meta["finish_reason"] == mine.response_metadata["finish_reason"]
    # A stop string travels as the request's `stop`; both cut the reply at the same place.
    stop = mine.text[len(mine.text) // 2 :][:3]
    cut_mine = local.invoke(ASK, max_tokens=24, stop=[stop])
    cut_theirs = remote.invoke(ASK, max_tokens=24, stop=[stop])
    assert stand_in.stops[-1] == [stop]
    assert cut_theirs.text == cut_mine.text and len(cut_theirs.text) < len(mine.text)
    assert cut_theirs.response_metadata["finish_reason"] == "stop"
    assert cut_theirs.response_metadata["stop_sequence"] == stop
    ids = cut_theirs.response_metadata["completion_ids"]
    assert ids == cut_mine.response_metadata["completion_ids"]
    assert len(cut_theirs.response_metadata["logprobs"]) == len(ids)
    # A forced tool call: the same prefill, the same arguments, the call ended where it closed.
    call_mine = local.bind_tools([lookup], tool_choice="lookup").invoke(ASK, max_tokens=24)
    call_theirs = remote.bind_tools([lookup], tool_choice="lookup").invoke(ASK, max_tokens=24)
    assert call_theirs.tool_calls == call_mine.tool_calls
    assert call_theirs.tool_calls[0]["name"] == "lookup"
    assert "".join(c.text for c in remote.stream(ASK, max_tokens=24)) == mine.text


def test_vllm_engine_server_reply_is_cut_where_the_watch_fires() -> None:
    # What the server returns past the point a local decode would stop is dropped.
    rule = RepetitionRule()
    ids = [9, 8] + [1, 2, 3] * 30
    fired = next(end for end in range(1, len(ids) + 1) if rule.period(ids[:end]) is not None)
    watch = StopWatch(lambda got: " ".join(map(str, got)), repetition=rule)
    from flowlearn.engine.stops import watch_completion

    kept, logprobs, text = watch_completion(watch, ids, [-0.5] * len(ids))
    assert kept == ids[:fired] and logprobs == [-0.5] * fired and fired < len(ids)
    assert text == " ".join(map(str, ids[:fired])) and watch.reason == "repetition"
    # Not fired: all kept, the text decoded from the ids; logprobs that do not pair are dropped.
    quiet = StopWatch(lambda got: "".join(map(str, got)), stop=("9",), repetition=None)
    assert watch_completion(quiet, [1, 2, 3], [-1.0, -2.0]) == ([1, 2, 3], None, "123")


def test_vllm_engine_server_needs_the_tokenizer() -> None:
    with pytest.raises(ValueError, match="needs its model's tokenizer here"):
        ServerChatModel(policy=ServerPolicy("http://h:1/v1", "m", api_key_env=None))


def test_vllm_engine_server_from_the_cli(
    tiny_model_dir: Path,
    served: tuple[StandInLoraServer, str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stand_in, url = served
    before = len(stand_in.models_named)
    tiny = str(tiny_model_dir)
    flags = ["--max-turns", "1", "--max-new-tokens", "8", "--engine-max-new-tokens", "8"]
    flags += ["--tools", "local_search", "--temperature", "0", "--query-analysis"]  # served too
    # The planner local, the engine served.
    engine = ["--engine-url", url, "--engine", tiny]
    assert main(["run", "What is 2+2?", "--planner", tiny, *engine, *flags]) == 0
    engine_calls = len(stand_in.models_named) - before
    assert engine_calls >= 2 and set(stand_in.models_named[before:]) == {tiny}
    assert f"engine: {tiny}@server at {url}" in capsys.readouterr().out

    # Both on one server: every call goes there, no model loads here.
    def no_local(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a local model was loaded")

    monkeypatch.setattr("flowlearn.compose.models.load_local_models", no_local)
    before = len(stand_in.models_named)
    assert (
        main(["run", "What is 2+2?", "--planner-url", url, "--planner", tiny, *engine, *flags]) == 0
    )
    assert len(stand_in.models_named) - before == engine_calls + 1  # and the planner's turn
    shown = capsys.readouterr().out
    assert f"planner: {tiny}@server at {url}" in shown and f"at {url}  tools" in shown


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--engine-url", "http://h:1/v1"], "--engine-url needs --engine"),
        (["--engine-url", "http://h:1/v1", "--engine", "default"], "--engine-url needs --engine"),
        (["--engine-url", "h:1/v1", "--engine", "m"], "--engine-url must be the server's base"),
    ],
)
def test_vllm_engine_server_cli_refusals(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "q", *flags]) == 2
    assert message in capsys.readouterr().err


def test_vllm_engine_server_tokenizer_must_load(tmp_path: Path) -> None:
    from flowlearn.compose import ServedNameError, server_engine

    with pytest.raises(ServedNameError, match="its tokenizer does not load here"):
        server_engine("http://h:1/v1", str(tmp_path))


@pytest.mark.slow
def test_vllm_engine_server_training_one_server_serves_both_roles(
    tiny_model_dir: Path, tmp_path: Path, served: tuple[StandInLoraServer, str]
) -> None:
    pytest.importorskip("peft")
    from flowlearn.training.vllm.lora_server import adapter_name

    stand_in, url = served
    start = len(stand_in.events)
    tiny, out = str(tiny_model_dir), tmp_path / "out"
    flags = [
        *("--planner", tiny, "--benchmark", "gameof24", "--limit", "2", "--bf16", "false"),
        *("--num_generations", "2", "--questions-per-step", "1", "--max-turns", "1"),
        *("--max_completion_length", "8", "--engine-max-new-tokens", "8", "--max-steps", "2"),
        *("--output-dir", str(out), "--planner_url", url, "--engine_url", url, "--engine", tiny),
    ]
    assert main(["train", *flags]) == 0
    run_id = json.loads((out / "run.json").read_text())["run_id"]
    steps = [adapter_name(run_id, 0), adapter_name(run_id, 1)]
    events = stand_in.events[start:]
    assert events[0] == f"load:{steps[0]}"
    second = events.index(f"load:{steps[1]}")
    # Each step: the planner on that step's adapter, the engine on the base, nothing local.
    assert {f"complete:{steps[0]}", f"complete:{tiny}"} <= set(events[1:second])
    assert {f"complete:{steps[1]}", f"complete:{tiny}"} <= set(events[second + 1 :])
    assert not {e for e in events if e.startswith("complete:")} - {
        f"complete:{name}" for name in (*steps, tiny)
    }
    planner_calls = sum(e.startswith("complete:flow-") for e in events)
    assert planner_calls == 4  # 2 steps x G=2 rollouts x 1 turn; the rest are the engine's


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--engine_url", "h:8000/v1", "--engine", "m"], "engine_url must be the server's"),
        (["--engine_url", "http://h:8000/v1"], "engine_url needs engine"),
        (["--engine_url", "http://h:8000/v1", "--engine", "base"], "'base' is the frozen base"),
    ],
)
def test_vllm_engine_server_training_refusals(flags: list[str], message: str) -> None:
    from flowlearn.training.config import FlowGRPOConfig, parse_config

    with pytest.raises(ValueError, match=message):
        parse_config(["--benchmark", "gameof24", *flags])
    with pytest.raises(ValueError, match="offline training"):
        FlowGRPOConfig(trajectories="t.jsonl", engine_url="http://h:8000/v1", engine="m")
