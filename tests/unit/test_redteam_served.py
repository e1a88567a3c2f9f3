"""Red-team attacks on served generation: silent, slow, huge and malformed servers on 127.0.0.1.

Each stand-in is a real HTTP server on a free local port that writes its reply by hand, so it
can hang, trickle, flood or lie in ways a well-behaved server never would.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.engine.chat import ServerChatModel
from flowlearn.engine.sampling import Sampling
from flowlearn.engine.server import ServerPolicy
from flowlearn.errors import ServerReplyError
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.planner import make_planner
from flowlearn.nodes.retry import ENGINE_RETRY, is_transient, retrying
from flowlearn.training import build_flow_grpo_rows
from flowlearn.training.trajectories import trajectory_from_state

MESSAGES = [{"role": "user", "content": "What is 17 * 23?"}]
Write = Callable[[BaseHTTPRequestHandler, threading.Event], None]


@dataclass
class RawServer:
    url: str
    """The OpenAI base URL, ending in /v1."""
    requests: list[dict[str, Any]] = field(default_factory=list)


@contextmanager
def raw_server(write: Write) -> Iterator[RawServer]:
    """Serve on a free port; `write` sends each reply by hand (the event is set at teardown)."""
    release = threading.Event()
    holder: dict[str, RawServer] = {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            holder["server"].requests.append(json.loads(self.rfile.read(length) or b"null"))
            with contextlib.suppress(OSError):  # the client gave up first
                write(self, release)
            self.close_connection = True

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder["server"] = RawServer(f"http://127.0.0.1:{server.server_address[1]}/v1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield holder["server"]
    finally:
        release.set()
        server.shutdown()
        server.server_close()


def silent(handler: BaseHTTPRequestHandler, release: threading.Event) -> None:
    release.wait(60)  # never answers


def byte_a_second(handler: BaseHTTPRequestHandler, release: threading.Event) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    while not release.wait(0.5):  # each read returns, so a per-read timeout never fires
        handler.wfile.write(b" ")
        handler.wfile.flush()


def slow_headers(handler: BaseHTTPRequestHandler, release: threading.Event) -> None:
    handler.wfile.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    while not release.wait(0.5):
        handler.wfile.write(b"a")
        handler.wfile.flush()


def flood(declare: bool) -> Write:
    """Send zeros until stopped; `declare` says a 2 GB Content-Length first."""

    def write(handler: BaseHTTPRequestHandler, release: threading.Event) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if declare:
            handler.send_header("Content-Length", str(2 * 2**30))
        handler.end_headers()
        chunk = b"0" * 2**20
        for _ in range(300):  # 300 MiB at most
            if release.is_set():
                return
            handler.wfile.write(chunk)

    return write


def body(payload: bytes, content_type: str = "application/json", status: int = 200) -> Write:
    def write(handler: BaseHTTPRequestHandler, release: threading.Event) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    return write


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


def timed(call: Callable[[], Any]) -> tuple[BaseException, float]:
    start = time.perf_counter()
    with pytest.raises(ServerReplyError) as info:
        call()
    return info.value, time.perf_counter() - start


@pytest.mark.parametrize("write", [silent, byte_a_second, slow_headers])
def test_a_silent_or_trickling_server_is_given_up_on_at_the_deadline_and_not_retried(
    write: Write,
) -> None:
    with raw_server(write) as server:
        policy = ServerPolicy(server.url, "m", timeout_s=1.0)
        generate = retrying(policy.generate, ENGINE_RETRY)
        error, seconds = timed(lambda: generate(MESSAGES, Sampling()))
        assert len(server.requests) == 1  # a spent deadline is not transient
    assert 0.9 < seconds < 2.0, seconds
    assert not is_transient(error)
    assert f"the generation server at {server.url} sent no whole reply within 1.0 s" in str(error)
    assert "(the policy's timeout_s)" in str(error)


def test_the_runs_remaining_budget_is_the_calls_deadline() -> None:
    with raw_server(silent) as server:
        policy = ServerPolicy(server.url, "m")  # timeout_s 300
        deadline = time.time() + 1.0
        error, seconds = timed(lambda: policy.generate(MESSAGES, Sampling(deadline=deadline)))
        assert seconds < 1.8 and "(the run's remaining max_seconds)" in str(error)
        spent = Sampling(deadline=time.time() - 1)
        error, seconds = timed(lambda: policy.generate(MESSAGES, spent))
        assert len(server.requests) == 1  # nothing sent once the time is up
    assert seconds < 0.2 and "no time was left in the run's budget" in str(error)


def test_the_deadline_limits_the_call_without_changing_what_is_sampled() -> None:
    plain, bounded = Sampling(seed=3), Sampling(seed=3, deadline=time.time() + 5)
    assert plain == bounded and hash(plain) == hash(bounded)  # greedy calls still share
    assert bounded.as_dict() == plain.as_dict() and "deadline" not in plain.as_dict()
    assert bounded.for_call("q", 1).deadline == bounded.deadline
    with pytest.raises(ValueError, match="deadline must be a finite"):
        Sampling(deadline=float("nan"))


@pytest.mark.parametrize(
    ("declare", "says"), [(True, "declares 2147483648 bytes"), (False, "ran past 1048576 bytes")]
)
def test_a_huge_reply_is_refused_as_it_arrives_with_bounded_memory(
    declare: bool, says: str
) -> None:
    with raw_server(flood(declare)) as server:
        policy = ServerPolicy(server.url, "m", max_response_bytes=2**20, timeout_s=30)
        tracemalloc.start()
        try:
            error, seconds = timed(lambda: policy.generate(MESSAGES, Sampling()))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert len(server.requests) == 1
    assert says in str(error) and "max_response_bytes (1048576)" in str(error)
    assert server.url in str(error) and not is_transient(error)
    assert peak < 16 * 2**20, peak  # the cap and a read's chunks, never the 300 MiB sent
    assert seconds < 10


GOOD_CHOICE = {
    "text": "ab",
    "token_ids": [5, 6],
    "prompt_token_ids": [1, 2, 3],
    "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.1, -0.2]},
}


def choice(**changes: Any) -> bytes:
    return json.dumps({"choices": [{**GOOD_CHOICE, **changes}]}).encode()


MALFORMED = {
    "truncated JSON": (b'{"choices": [{"text": ', "is not JSON"),
    "an HTML page": (b"<html><body>502 Bad Gateway</body></html>", "is an HTML page"),
    "a JSON list": (b"[1, 2]", "is a JSON list, not an object"),
    "no choices": (b'{"object": "error"}', "`choices` is missing, not a list"),
    "empty choices": (b'{"choices": []}', "`choices` is empty"),
    "a number for text": (choice(text=5), "`choices[0].text` is a int, not a string"),
    "a string choice": (b'{"choices": ["hi"]}', "`choices[0]` is a str, not an object"),
    "string token ids": (choice(token_ids=["5", "6"]), "completion_ids[0] = '5' (not a whole"),
    "a negative id": (choice(token_ids=[5, -5]), "completion_ids[1] = -5 (a negative token id)"),
    "an id past the vocabulary": (
        choice(token_ids=[10**12, 6]),
        "completion_ids[0] = 1000000000000 (outside the vocabulary of 400 tokens)",
    ),
    "a prompt id past it": (
        choice(prompt_token_ids=[1, 400]),
        "prompt_ids[1] = 400 (outside the vocabulary",
    ),
    "a logprob of +3": (
        choice(logprobs={"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [3.0, -0.1]}),
        "logprobs[0] = 3.0 (above 0: not a log-probability)",
    ),
    "a logprob of 1e308": (
        choice(logprobs={"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.1, 1e308]}),
        "logprobs[1] = 1e+308 (above 0",
    ),
    "a NaN logprob": (
        choice(logprobs={"tokens": ["token_id:5"], "token_logprobs": [float("nan")]}),
        "logprobs[0] = nan (not a finite number)",
    ),
    "a string logprob": (
        choice(logprobs={"tokens": ["token_id:5"], "token_logprobs": ["-0.5"]}),
        "logprobs[0] = '-0.5' (not a finite number)",
    ),
    "a bad token_id token": (
        choice(token_ids=None, logprobs={"tokens": ["token_id:x"], "token_logprobs": [-0.5]}),
        "token 'token_id:x' names no token id",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_a_malformed_reply_is_one_clear_error_naming_the_server_never_retried(
    tokenizer: Any, case: str
) -> None:
    payload, says = MALFORMED[case]
    kind = "text/html" if payload.startswith(b"<") else "application/json"
    with raw_server(body(payload, kind)) as server:
        policy = ServerPolicy(server.url, "m", tokenizer=tokenizer)
        generate = retrying(policy.generate, ENGINE_RETRY)
        error, _ = timed(lambda: generate(MESSAGES, Sampling(max_new_tokens=4)))
        assert len(server.requests) == 1, "a malformed reply was retried"
    assert str(error).startswith(f"the generation server at {server.url} sent a reply")
    assert says in str(error), str(error)
    assert not is_transient(error)


def test_a_well_formed_reply_still_passes_the_checks(tokenizer: Any) -> None:
    with raw_server(body(choice())) as server:
        gen = ServerPolicy(server.url, "m", tokenizer=tokenizer).generate(MESSAGES, Sampling())
    assert gen.completion_ids == [5, 6] and gen.logprobs == [-0.1, -0.2] and gen.token_faithful


def test_an_id_in_a_padded_vocabulary_passes(tokenizer: Any, tmp_path: Path) -> None:
    """A model's embedding may have more rows than its tokenizer has tokens (Qwen2.5 pads
    151,665 to 152,064), and a sampled padded id is real: the bound is the config's size."""
    padded = len(tokenizer) + 16
    tokenizer.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": padded}))
    from transformers import AutoTokenizer

    beside_config = AutoTokenizer.from_pretrained(tmp_path)
    ids = [len(tokenizer) + 3, 6]
    with raw_server(body(choice(token_ids=ids))) as server:
        policy = ServerPolicy(server.url, "m", tokenizer=beside_config)
        assert policy.vocab_size == padded
        assert policy.generate(MESSAGES, Sampling()).completion_ids == ids
        assert ServerPolicy(server.url, "m", tokenizer=tokenizer).vocab_size == len(tokenizer)
    with raw_server(body(choice(token_ids=[padded, 6]))) as server:
        error, _ = timed(
            lambda: ServerPolicy(server.url, "m", vocab_size=padded).generate(MESSAGES, Sampling())
        )
    assert f"completion_ids[0] = {padded} (outside the vocabulary of {padded} tokens)" in str(error)


def test_a_key_in_a_malformed_page_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLOWLEARN_TEST_SERVED_KEY", "sk-served-secret-4242")
    page = b"<html>bad token sk-served-secret-4242</html>"
    with raw_server(body(page, "text/html")) as server:
        policy = ServerPolicy(server.url, "m", api_key_env="FLOWLEARN_TEST_SERVED_KEY")
        error, _ = timed(lambda: policy.generate(MESSAGES, Sampling()))
    assert "sk-served-secret-4242" not in str(error) and "[redacted]" in str(error)


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        ServerPolicy("http://127.0.0.1:9/v1", "m", timeout_s=float("inf"))
    with pytest.raises(ValueError, match="max_response_bytes must be a whole number >= 1024"):
        ServerPolicy("http://127.0.0.1:9/v1", "m", max_response_bytes=10)


@tool
def lookup(query: str) -> str:
    """Look a fact up."""
    return "Paris"


def test_a_silent_planner_server_ends_the_run_in_its_budget_with_a_recorded_error() -> None:
    engine = FakeChatModel(default_args={"query": "x"}, text="Conclusion: STOP <answer>x</answer>")
    with raw_server(silent) as server:
        graph = build_agentflow(ServerPolicy(server.url, "m"), engine, [lookup])
        start = time.perf_counter()
        state = graph.invoke(
            {"question": "Capital of France?"},
            context=Context(max_seconds=1.5, query_analysis=False),
        )
        seconds = time.perf_counter() - start
    assert seconds < 3.0, seconds
    assert state["termination"] == "engine_error" and state["answer"] == "x"
    (planner,) = [t for t in state["transitions"] if t["node"] == "planner"]
    assert planner["parse_status"] == "error" and server.url in planner["output"]
    assert "within 1.5 s" in planner["output"] or "within 1.4 s" in planner["output"]
    (record,) = state["memory"]
    assert record["error"] == planner["output"]
    # the failed call has no tokens to train: left out, counted, and the build goes on
    trajectory = trajectory_from_state(state, trajectory_id="a/0", group_id="a", reference="x")
    batch = build_flow_grpo_rows([trajectory])
    assert batch.rows == [] and batch.stats["rows_dropped"] == 1


def test_a_failing_policy_analysis_is_recorded_and_the_decision_too() -> None:
    with raw_server(body(b'{"choices": []}')) as server:
        node = make_planner(ServerPolicy(server.url, "m"), [lookup])
        runtime = SimpleNamespace(context=Context(query_analysis=True))
        update = node({"question": "Capital of France?"}, runtime)
        assert len(server.requests) == 2  # the analysis and the decision, once each
    analysis, decision = update["transitions"]
    assert analysis["node"] == "query_analysis" and analysis["parse_status"] == "error"
    assert update["analysis"].startswith("(no query analysis: the planner's policy failed:")
    assert decision["parse_status"] == "error" and "`choices` is empty" in decision["output"]
    assert update["termination"] == "engine_error" and update["plan"] is None


def test_a_served_engine_that_fails_is_recorded_by_every_node_never_raised(
    tokenizer: Any,
) -> None:
    with raw_server(body(b"<html>Bad Gateway</html>", "text/html")) as server:
        engine = ServerChatModel(policy=ServerPolicy(server.url, "engine", tokenizer=tokenizer))
        policy = ScriptedPolicy([plan("lookup")])
        graph = build_agentflow(policy, engine, [lookup])
        state = graph.invoke(
            {"question": "Capital of France?"}, context=Context(max_turns=1, query_analysis=False)
        )
    failed = [t for t in state["transitions"] if t["parse_status"] == "error"]
    assert {t["node"] for t in failed} >= {"executor", "verifier", "generator"}
    assert all(
        f"server at {server.url}" in t["output"] and "HTML page" in t["output"] for t in failed
    )
    assert len(server.requests) == len(failed)  # each failed once: never retried
    assert state["answer"] == "" and state["termination"] is not None


def test_a_silent_engine_server_ends_the_run_in_its_budget(tokenizer: Any) -> None:
    """The engine's calls carry the run's deadline too (`within_run_budget`), not only their
    own `timeout_s` (300 s here): the executor's call ends with the budget, the later ones
    are not sent."""
    with raw_server(silent) as server:
        engine = ServerChatModel(policy=ServerPolicy(server.url, "engine", tokenizer=tokenizer))
        graph = build_agentflow(ScriptedPolicy([plan("lookup")]), engine, [lookup])
        start = time.perf_counter()
        state = graph.invoke(
            {"question": "Capital of France?"},
            context=Context(max_seconds=1.5, max_turns=3, query_analysis=False),
        )
        seconds = time.perf_counter() - start
        sent = len(server.requests)
    assert seconds < 3.0, seconds
    assert sent == 1  # the executor's; the verifier and generator had no time left to ask
    failed = {t["node"]: t["output"] for t in state["transitions"] if t["parse_status"] == "error"}
    assert "sent no whole reply within" in failed["executor"]
    assert "(the run's remaining max_seconds)" in failed["executor"]
    assert "no time was left in the run's budget" in failed["verifier"]
    assert state["termination"] is not None


def test_the_first_visits_analysis_on_a_silent_engine_ends_in_the_budget(tokenizer: Any) -> None:
    """The query analysis runs before the run's clock is in the state: it starts now."""
    with raw_server(silent) as server:
        engine = ServerChatModel(policy=ServerPolicy(server.url, "engine", tokenizer=tokenizer))
        graph = build_agentflow(ScriptedPolicy([plan("lookup")]), engine, [lookup])
        start = time.perf_counter()
        state = graph.invoke(
            {"question": "Capital of France?"},
            context=Context(max_seconds=1.5, max_turns=3, query_analysis=True),
        )
        seconds = time.perf_counter() - start
    assert seconds < 3.0, seconds
    (analysis,) = [t for t in state["transitions"] if t["node"] == "query_analysis"]
    assert (
        analysis["parse_status"] == "error" and "sent no whole reply within" in analysis["output"]
    )


def test_a_trained_executor_and_verifier_on_a_failing_server_are_recorded_never_raised(
    tokenizer: Any,
) -> None:
    engine = FakeChatModel(default_args={"query": "x"}, text="Conclusion: STOP <answer>x</answer>")
    with raw_server(body(b'{"choices": []}')) as server:
        served = ServerPolicy(server.url, "m", tokenizer=tokenizer)
        graph = build_agentflow(
            ScriptedPolicy([plan("lookup")]),
            engine,
            [lookup],
            executor_policy=served,
            verifier_policy=served,
        )
        state = graph.invoke(
            {"question": "Capital of France?"}, context=Context(max_turns=2, query_analysis=False)
        )
    failed = {t["node"]: t for t in state["transitions"] if t["parse_status"] == "error"}
    assert set(failed) == {"executor", "verifier"}
    assert failed["executor"]["output"].startswith("the executor's policy failed:")
    assert failed["verifier"]["output"].startswith("the verifier's policy failed:")
    assert all("`choices` is empty" in t["output"] for t in failed.values())
    assert state["termination"] == "engine_error" and state["answer"] == "x"


@pytest.mark.slow
def test_flowlearn_run_against_a_silent_planner_server_ends_in_its_budget(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flowlearn.cli import main

    with raw_server(silent) as server:
        argv = ["run", "What is 17 * 23?", "--planner-url", server.url]
        argv += ["--planner", str(tiny_model_dir), "--engine", str(tiny_model_dir)]
        argv += ["--max-seconds", "2", "--max-turns", "2", "--engine-max-new-tokens", "4"]
        start = time.perf_counter()
        assert main(argv) == 0
        seconds = time.perf_counter() - start
    out = capsys.readouterr().out
    assert seconds < 12, seconds  # the budget, the tiny models' loading and their few tokens
    failed = "planner: the planner's policy failed: ServerReplyError: the generation server"
    assert f"{failed} at {server.url} sent no whole reply within" in out
    assert "(the run's remaining max_seconds)" in out
    assert "(engine_error, 1 turns," in out
