"""Secrets: API keys in the environment or handed to constructors never reach a record or a log."""

from __future__ import annotations

import base64
import doctest
import hashlib
import json
import logging
import os
import re
import subprocess
import sys
import uuid
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import quote

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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Authorization: Basic dXNlcjpodW50ZXIy", "Authorization: Basic [redacted]"),
        ("proxy-authorization: basic dXNlcjpodW50ZXIy", "proxy-authorization: basic [redacted]"),
        (
            "curl -H 'Authorization: Token 0123abcd4567'",
            "curl -H 'Authorization: Token [redacted]'",
        ),
        ('{"Authorization": "a1b2c3d4e5f6"}', '{"Authorization": "[redacted]"}'),
        ("sent Basic dXNlcjpodW50ZXIy to it", "sent Basic [redacted] to it"),
        ("X-Api-Key: abcdefghijkl", "X-Api-Key: [redacted]"),
        ("x-goog-api-key: AbCdEfGhIjKl", "x-goog-api-key: [redacted]"),
        ("Ocp-Apim-Subscription-Key: 0123abcd0123abcd", "Ocp-Apim-Subscription-Key: [redacted]"),
        ("X-Auth-Token: tok-12345678", "X-Auth-Token: [redacted]"),
        ("Cookie: session=abc123; theme=dark", "Cookie: [redacted]"),
        ("api_key = 'correct horse battery'", "api_key = '[redacted]'"),
        ('{"client_secret": "s3cr3t-value"}', '{"client_secret": "[redacted]"}'),
        ('{\\"password\\": \\"hunter22\\"}', '{\\"password\\": \\"[redacted]\\"}'),
        ("apiKey: 'abcdefghij'", "apiKey: '[redacted]'"),
        ("GITHUB_PAT=abc123def456", "GITHUB_PAT=[redacted]"),
        ("export GH_PAT=abc123def456", "export GH_PAT=[redacted]"),
        (
            "SLACK_WEBHOOK_URL=https://chat.test/hook/T01/B02/x9",
            "SLACK_WEBHOOK_URL=[redacted]",
        ),
        ("SENTRY_DSN: https://abc123@o1.ingest.test/9", "SENTRY_DSN: [redacted]"),
        ("db_pass=hunter22 and DB_PWD=hunter22", "db_pass=[redacted] and DB_PWD=[redacted]"),
        ("AccountKey=abc123+def/456==;", "AccountKey=[redacted];"),
    ],
)
def test_credential_headers_and_secret_named_assignments_are_redacted(
    text: str, expected: str
) -> None:
    assert redact(text) == expected


def project_digests() -> list[str]:
    """The digests and ids the project itself prints and stores."""
    data = hashlib.sha256(b"question,answer\n").hexdigest()
    return [
        f"file train.jsonl sha256:{data[:16]}",  # compose.flows' data provenance
        f"sha256 {data} split",  # bench/learning.py's result files
        f"commit {hashlib.sha1(b'x').hexdigest()} run {uuid.uuid4().hex[:12]}",
        f"trajectory step3:q7/2@{uuid.uuid4().hex[:12]} {uuid.uuid4()}",
        f"{data.upper()} {base64.b64encode(hashlib.sha256(b'y').digest()).decode()}",
    ]


@pytest.mark.parametrize(
    "text",
    [
        "Basic arithmetic and basic algebra come first.",
        "The secret: photosynthesis. The key: water. Bearer of bad news.",
        "authorization: required for every request",
        "max_tokens=4096 max_new_tokens: 512 token_count=12345678 prompt_tokens: 100000000",
        "token = tokenizer.encode(text); cache_key=abc12345678; keyword=capital123",
        "author: Jane Doe; monkey=banana12345; primary_key = user_id_12",
        "[151644, 872, 198, 3838, 374, 220, 17, 488, 220, 17, 30] logprobs [-0.25, -1.5]",
        "https://en.wikipedia.org/wiki/Paris?lang=en&search=capital+of+France&limit=10",
        "Step 2 (tool python):\n  Sub-Goal: compute 17 * 23\n  Result: 391",
        '{"name": "local_search", "arguments": {"query": "capital of France"}}',
        "sk-learn-compatible models, a task-based desk-lamp, risk-adjusted returns",
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk",
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUSq\n-----END CERTIFICATE-----",
        *project_digests(),
    ],
)
def test_ordinary_text_token_ids_and_digests_are_kept(text: str) -> None:
    assert redact(text) == text


def sample_tokens() -> dict[str, str]:
    """One made-up token of each format, built here so that no scanner takes the file for a leak."""
    hexes = "0123456789abcdef" * 4
    return {
        "GitHub classic": "ghp_" + "A1b2" * 9,
        "GitHub OAuth": "gho_" + "Z9y8" * 9,
        "GitHub fine-grained": "github_pat_" + "11AB" * 6 + "_" + "x7" * 29,
        "GitLab": "glpat-" + "Ab1_" * 5,
        "Slack bot": "xoxb-" + "1234567890-1234567890-" + "AbCd" * 6,
        "Slack user": "xoxp-" + "1234567890-" * 3 + "a1" * 16,
        "Slack webhook": "https://hooks.slack.com/services/T0123/B0456/" + "Xy9" * 8,
        "AWS": "AKIA" + "IOSFODNN7EXAMPLE",
        "OpenAI": "sk-proj-" + "Ab3d" * 12,
        "Anthropic": "sk-ant-api03-" + "x1Y2" * 23 + "AA",
        "Google": "AIza" + "Sy" + "A1b2C3d4E5" * 3 + "abc",
        "Stripe": "sk_live_" + "Ab12" * 6,
        "Hugging Face": "hf_" + "AbCd" * 8 + "xy",
        "JWT": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0." + "dozjgNryP4J3jVmNHl0w5N",
        "npm": "npm_" + "a1B2" * 9,
        "PyPI": "pypi-AgEIcHlwaS5vcmc" + "x1" * 30,
        "SendGrid": "SG." + "a1" * 11 + "." + "b2" * 21,
        "Twilio": "SK" + hexes[:32],
        "Tavily": "tvly-dev-" + "Ab12" * 8,
        "Databricks": "dapi" + hexes[:32],
        "Groq": "gsk_" + "Ab12" * 13,
        "Telegram": "123456789:AA" + "Ab1_" * 8 + "x",
        "Mailgun": "key-" + hexes[:32],
        "age": "AGE-SECRET-KEY-1" + "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L" + "Q" * 26,
        "RSA private key": "-----BEGIN RSA PRIVATE KEY-----\nMIIEow"
        + "A1b2" * 16
        + "\n-----END RSA PRIVATE KEY-----",
        "OpenSSH key, cut short": "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn" + "Nz" * 40,
    }


@pytest.mark.parametrize("service", list(sample_tokens()))
def test_well_known_token_formats_are_redacted_by_shape(service: str) -> None:
    token = sample_tokens()[service]
    out = redact(f"the log said {token} then stopped")
    assert out.startswith("the log said ") and out.endswith(" then stopped")
    assert REDACTED in out and token[-10:] not in out and len(out) < 45, out


def base64_decodes_to(text: str, secret: bytes) -> bool:
    """Whether a base64 run in `text`, read from any of its 4 character offsets, holds `secret`."""
    for run in re.findall(r"[A-Za-z0-9+/_-]{8,}", text):
        run = run.replace("-", "+").replace("_", "/")
        for skip in range(4):
            part = run[skip:][: (len(run) - skip) // 4 * 4]
            if secret in base64.b64decode(part):
                return True
    return False


def test_every_encoding_of_a_secret_named_variable_is_redacted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key = f"{uuid.uuid4().hex[:12]}/+?~{uuid.uuid4().hex[:6]}"  # each encoding differs
    monkeypatch.setenv("GITHUB_PAT", key)
    raw = key.encode()
    std, urlsafe = base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()
    quoted = quote(key, safe="")
    forms = {
        "as is": key,
        "%-quoted": quoted,
        "%-quoted, lower case": re.sub(r"%[0-9A-F]{2}", lambda m: m[0].lower(), quoted),
        "every byte %-quoted": "".join(f"%{b:02x}" for b in raw),
        "JSON with \\/": json.dumps(key).replace("/", "\\/")[1:-1],
        "base64": std,
        "base64 unpadded": std.rstrip("="),
        "base64 URL-safe": urlsafe,
        "base64 URL-safe unpadded": urlsafe.rstrip("="),
        "hex": raw.hex(),
        "HEX": raw.hex().upper(),
    }
    for name, form in forms.items():
        out = redact(f"echo {form} end")
        assert out == f"echo {REDACTED} end", name
    for offset in range(3):  # inside a longer base64 text, at each byte offset
        blob = base64.b64encode(b"user:"[:offset] + raw + b"@host:443/path").decode()
        out = redact(f"payload {blob} end")
        assert REDACTED in out and not base64_decodes_to(out, raw), offset
    long_hex = (b"\x00\x01" + raw + b"\xff").hex()
    assert raw.hex() not in redact(f"0x{long_hex}") and raw.hex() not in redact(long_hex.upper())
    monkeypatch.delenv("GITHUB_PAT")  # read once, remembered: a late echo is still caught
    assert redact(f"echo {key}") == f"echo {REDACTED}"


def test_a_digest_is_redacted_only_when_it_encodes_a_known_key() -> None:
    key = fresh("digest")
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert redact(f"sha256:{digest}") == f"sha256:{digest}"  # a hash of the key is not the key
    remember(key)
    assert redact(f"hex {key.encode().hex()}") == f"hex {REDACTED}"


SECRET_NAMES = [
    "OPENAI_API_KEY", "HF_TOKEN", "AWS_SESSION_TOKEN", "AUTH_HEADER", "apikey", "GITHUB_PAT",
    "GH_PAT", "SLACK_WEBHOOK_URL", "DISCORD_WEBHOOK", "SENTRY_DSN", "SSH_PRIVATE_KEY",
    "GITLAB_PRIVATE_TOKEN", "SESSION_ID", "SESSION_COOKIE", "COOKIE", "REQUEST_SIGNATURE",
    "DB_PASS", "DB_PWD", "MYSQL_PASSWORD", "GPG_PASSPHRASE", "AZURE_STORAGE_CONNECTION_STRING",
    "GOOGLE_APPLICATION_CREDENTIALS",
]  # fmt: skip
HARMLESS_NAMES = [
    "PATH", "PWD", "OLDPWD", "HOME", "PATHEXT", "COMPAT_MODE", "TOKENIZERS_PARALLELISM",
    "GIT_AUTHOR_NAME", "SSH_AUTH_SOCK", "DESKTOP_SESSION", "SESSION_MANAGER", "XDG_SESSION_TYPE",
    "DBUS_SESSION_BUS_ADDRESS", "KEYBOARD_LAYOUT", "PYTHON_KEYRING_BACKEND", "HF_TOKEN_PATH",
    "SSL_PRIVATE_KEY_FILE", "OPENAI_API_BASE", "WANDB_PROJECT", "PASSWORD_STORE_DIR",
]  # fmt: skip


def test_secret_looking_variable_names_and_harmless_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    assert secrets.secret_names(SECRET_NAMES + HARMLESS_NAMES) == SECRET_NAMES
    values = {name: fresh(name.lower()) for name in SECRET_NAMES + HARMLESS_NAMES}
    for name in [*SECRET_NAMES, *HARMLESS_NAMES[4:]]:  # PATH, PWD, OLDPWD, HOME stay as they are
        monkeypatch.setenv(name, values[name])
    out = redact(" ".join(values.values()))
    assert out.split() == [REDACTED] * len(SECRET_NAMES) + [values[n] for n in HARMLESS_NAMES]


class Config:
    def __init__(self, key: str) -> None:
        self.key = key

    def __str__(self) -> str:
        return f"Config(key={self.key})"


def test_a_record_is_redacted_throughout_with_its_numbers_exact() -> None:
    key = fresh("rec")
    remember(key)
    record = {
        "prompt_ids": [151644, 872, 198],
        "logprobs": [-0.125, -2.5],
        "reward": 1.0,
        "done": True,
        "none": None,
        "messages": [{"role": "user", "content": f"Tool result: {key}"}],
        f"tag {key}": ("a", key),
        "config": Config(key),
    }
    assert secrets.redact_record(record) == {
        "prompt_ids": [151644, 872, 198],
        "logprobs": [-0.125, -2.5],
        "reward": 1.0,
        "done": True,
        "none": None,
        "messages": [{"role": "user", "content": f"Tool result: {REDACTED}"}],
        f"tag {REDACTED}": ["a", REDACTED],
        "config": f"Config(key={REDACTED})",
    }
