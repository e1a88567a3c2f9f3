"""Secrets: API keys in the environment or handed to constructors never reach a record or a log."""

from __future__ import annotations

import doctest
import json
import logging
import os
import subprocess
import sys
import uuid
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from stand_in_server import Recorded, Reply, stand_in_server

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn import secrets
from flowlearn.engine.server import ServerPolicy
from flowlearn.evals.cases import Case
from flowlearn.evals.harness import run_eval
from flowlearn.evals.runner import run_resumable
from flowlearn.evals.scorers import SCORERS, judge_scorer
from flowlearn.graphs import Context
from flowlearn.graphs import build_agentflow as _build_agentflow
from flowlearn.nodes.retry import TransientEngineError, engine_error, with_retries
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools import web_search_tool
from flowlearn.secrets import REDACTED, redact, remember
from flowlearn.training import TrajectoryStore, collect

ROOT = Path(__file__).parents[2]
SECRETS = {
    "TAVILY_API_KEY": "tvly-FAKE-SECRET-7c1d2e",
    "OPENAI_API_KEY": "sk-FAKE-SECRET-93ab41",
    "HF_TOKEN": "hf_FAKE_SECRET_5e6f70",
    "ANTHROPIC_API_KEY": "sk-ant-FAKE-SECRET-0011",
}

# these tests script the engine by the smollm2 preset's prompt wording
build_agentflow = partial(_build_agentflow, prompts=SMOLLM2_PROMPTS)


def flowlearn(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SECRETS, "FLOWLEARN_CACHE": str(cwd / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "flowlearn", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.slow
def test_no_key_appears_in_any_file_or_output_of_a_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    pytest.importorskip("trl")
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        "\n".join(
            json.dumps({"id": f"q{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)})
            for i in range(2)
        )
        + "\n"
    )
    model = ["--planner", str(tiny_model_dir), "--engine-max-new-tokens", "8"]
    small = ["--max-turns", "1", "--max-new-tokens", "8", *model]
    runs = [
        [
            "run",
            "What is 2 + 2?",
            *small,
            "--save",
            "out/run.jsonl",
            "--thread",
            "t1",
            "--checkpoints",
            "out/checkpoints.sqlite",
        ],
        [
            "collect",
            "--data",
            str(cases),
            "--group-size",
            "2",
            "--out",
            "out/rollouts.jsonl",
            "--scorer",
            "exact_match",
            *small,
        ],
        [
            "eval",
            "--data",
            str(cases),
            "--scorer",
            "exact_match",
            "--out",
            "out/eval",
            "--save",
            "out/eval-states.jsonl",
            *small,
        ],
        [
            "train",
            "--data",
            str(cases),
            "--output-dir",
            "out/train",
            "--max-turns",
            "1",
            "--num_generations",
            "2",
            "--questions-per-step",
            "1",
            "--max_completion_length",
            "8",
            "--save-steps",
            "1",
            "--bf16",
            "false",
            "--use_cpu",
            "true",
            *model,
        ],
    ]
    printed = []
    for args in runs:
        done = flowlearn(args, tmp_path)
        assert done.returncode == 0, (args[0], done.stderr[-2000:])
        printed.append(done.stdout + done.stderr)

    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    kinds = {p.suffix for p in written}
    assert {".jsonl", ".sqlite", ".json", ".md", ".png", ".safetensors"} <= kinds, kinds
    for secret in SECRETS.values():
        for path in written:
            assert secret.encode() not in path.read_bytes(), f"{secret} leaked into {path}"
        for text in printed:
            assert secret not in text


def fresh(prefix: str) -> str:
    """A secret no earlier test has seen (known values are remembered process-wide)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def test_known_values_and_secret_shapes_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    from_env, passed, short = fresh("env"), fresh("arg"), "abc123"
    monkeypatch.setenv("MY_SERVICE_TOKEN", from_env)
    monkeypatch.setenv("SOME_API_KEY", short)  # too short to redact without garbling text
    monkeypatch.setenv("PLAIN_SETTING", "not-a-secret-value")
    remember(passed, None, "")
    text = (
        f"token {from_env} / {passed} / quoted {passed.replace('-', '%2D')} / {short} / "
        "not-a-secret-value / https://bob:pw-9f8e7d6c@wiki.test/api.php?apikey=k-1a2b3c&q=x / "
        "Authorization: Bearer sk-live-0123456789"
    )
    assert redact(text) == (
        f"token {REDACTED} / {REDACTED} / quoted {passed.replace('-', '%2D')} / {short} / "
        f"not-a-secret-value / https://{REDACTED}@wiki.test/api.php?apikey={REDACTED}&q=x / "
        f"Authorization: Bearer {REDACTED}"
    )
    with_slash = fresh("a/b")
    remember(with_slash)
    assert redact(f"?x=a%2Fb-{with_slash[4:]}") == f"?x={REDACTED}"  # its URL-quoted form
    assert doctest.testmod(secrets).failed == 0


def test_engine_retry_and_runner_errors_are_redacted(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    key = fresh("sk")
    monkeypatch.setenv("OPENAI_API_KEY", key)
    echo = RuntimeError(f"401: Incorrect API key provided: {key}")
    wrapped = TransientEngineError(str(echo))
    wrapped.__cause__ = ConnectionError(f"reset while sending {key}")
    for text in (engine_error(echo), engine_error(wrapped)):
        assert key not in text and REDACTED in text

    def fails() -> None:
        raise ConnectionError(f"connection to https://api.test/?token={key} refused")

    with pytest.raises(ConnectionError) as raised:
        with_retries(fails, transient=(ConnectionError,), retries=1, backoff=0)
    assert key not in str(raised.value)

    def crash(item: str) -> str:
        raise PermissionError(f"the server refused {key}")

    with caplog.at_level(logging.WARNING):
        assert run_resumable({"a": "a"}, crash, progress=False) == {}
    assert "PermissionError" in caplog.text and key not in caplog.text


@pytest.mark.parametrize("via", ["api_key", "environment"])
def test_a_tavily_403_echoing_the_key_reaches_no_memory_prompt_or_file(
    tmp_path: Path, via: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("tavily")
    key = fresh("tvly")
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    if via == "environment":
        monkeypatch.setenv("TAVILY_API_KEY", key)

    def forbidden(request: Recorded) -> Reply:
        sent = {k.lower(): v for k, v in request.headers.items()}["authorization"]
        return Reply(403, {"detail": {"error": f"{sent}: key {key} has no access"}})

    engine = FakeChatModel(default_args={"query": "capital of France"})
    with stand_in_server(forbidden) as server:
        search = web_search_tool(
            api_key=key if via == "api_key" else None, base_url=server.url, backoff=0
        )
        graph = build_agentflow(ScriptedPolicy([plan("web_search")]), engine, [search])
        store = TrajectoryStore(tmp_path / "rollouts.jsonl")
        with caplog.at_level(logging.DEBUG):
            (trajectory,) = collect(
                graph,
                [Case("q", "Capital of France?", "Paris")],
                SCORERS["exact_match"],
                group_size=1,
                store=store,
                context=Context(max_turns=1),
                progress=False,
            )
    assert key in server.requests[0].headers.get("Authorization", "")  # the echo was real
    (action,) = [r for r in trajectory.memory if r["kind"] == "action"]
    assert "ForbiddenError" in action["error"] and REDACTED in action["error"]
    prompts = [str(m.content) for call in engine.calls for m in call]
    assert any(p.startswith("Judge whether") and REDACTED in p for p in prompts)  # verifier
    assert any(p.startswith("Answer") and REDACTED in p for p in prompts)  # generator
    seen = [json.dumps(trajectory.memory), json.dumps(trajectory.transitions), *prompts]
    seen += [store.path.read_text(), caplog.text]
    assert all(key not in text for text in seen)


@pytest.mark.parametrize("key_env", ["OPENAI_API_KEY", "VLLM_SERVE_ACCESS"])
def test_a_server_401_echoing_the_bearer_token_stays_out_of_results(
    tmp_path: Path, key_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`VLLM_SERVE_ACCESS` does not look secret by name: the policy's own key is remembered."""
    token = fresh("sk")
    monkeypatch.setenv(key_env, token)

    def unauthorized(request: Recorded) -> Reply:
        sent = {k.lower(): v for k, v in request.headers.items()}["authorization"]
        message = f"Incorrect API key provided: {token}; you sent {sent}"
        return Reply(401, {"error": {"message": message}})

    def judge_down(messages: list[Any], tools: list[dict[str, Any]]) -> str:
        raise PermissionError(f"401 from the judge's server for key {token}")

    with stand_in_server(unauthorized) as server:
        planner = ServerPolicy(f"{server.url}/v1", "served", api_key_env=key_env)
        graph = build_agentflow(planner, FakeChatModel(), [lookup])
        failed = run_eval(
            graph, [Case("q", "q?", "Paris")], SCORERS["exact_match"], results_path=tmp_path / "a"
        )
        judged = run_eval(
            build_agentflow(ScriptedPolicy([plan("lookup")]), FakeChatModel(), [lookup]),
            [Case("q", "q?", "Paris")],
            judge_scorer(FakeChatModel(respond=judge_down)),
            results_path=tmp_path / "b",
        )
    assert token in server.requests[0].headers.get("Authorization", "")
    assert "401" in (failed[0].error or "") and REDACTED in (failed[0].error or "")
    assert (
        judged[0].reason.startswith("judge failed: PermissionError")
        and REDACTED in judged[0].reason
    )
    for path in (tmp_path / "a", tmp_path / "b"):
        assert token not in path.read_text()


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return "Paris"


def test_dotenv_files_are_git_ignored_but_the_template_is_not() -> None:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")

    def ignored(name: str) -> bool:
        check = ["git", "-C", str(ROOT), "check-ignore", "-q", "--no-index", name]
        return subprocess.run(check, check=False).returncode == 0

    assert ignored(".env") and ignored(".env.local") and ignored("examples/.env")
    assert not ignored(".env.example")
