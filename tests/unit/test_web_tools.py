from __future__ import annotations

import json
import socket
import uuid

import pytest
from langchain_core.tools import ToolException, tool
from stand_in_server import Recorded, Reply, stand_in_server

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.tools import web_search_tool, wikipedia_tool

pytest.importorskip("tavily")

RESULTS = {"results": [{"title": "Paris", "url": "https://x.test/paris", "content": "Capital."}]}


def scripted(*replies: Reply):
    calls = {"n": 0}

    def respond(request: Recorded) -> Reply:
        reply = replies[min(calls["n"], len(replies) - 1)]
        calls["n"] += 1
        return reply

    return respond


def test_web_search_success_sends_key_and_formats_results() -> None:
    with stand_in_server(scripted(Reply(200, RESULTS))) as server:
        tool = web_search_tool(api_key="tvly-test", base_url=server.url)
        out = tool.invoke({"query": "capital of France"})
    assert out == "[1] Paris\nURL: https://x.test/paris\nCapital."
    request = server.requests[0]
    assert request.path == "/search" and request.body["query"] == "capital of France"
    assert "tvly-test" in request.headers.get("Authorization", "")


def test_web_search_401_is_readable_and_not_retried() -> None:
    with stand_in_server(scripted(Reply(401, {"detail": {"error": "bad key"}}))) as server:
        tool = web_search_tool(api_key="wrong", base_url=server.url, backoff=0)
        with pytest.raises(ToolException, match="invalid API key"):
            tool.invoke({"query": "q"})
    assert len(server.requests) == 1


def test_web_search_retries_429_then_succeeds() -> None:
    with stand_in_server(scripted(Reply(429, {}), Reply(429, {}), Reply(200, RESULTS))) as server:
        out = web_search_tool(api_key="k", base_url=server.url, backoff=0.01).invoke({"query": "q"})
    assert out.startswith("[1] Paris") and len(server.requests) == 3


def test_web_search_timeout_is_a_readable_error() -> None:
    with stand_in_server(scripted(Reply(200, RESULTS, delay=1.0))) as server:
        tool = web_search_tool(api_key="k", base_url=server.url, timeout=0.2, retries=1, backoff=0)
        with pytest.raises(ToolException, match="after 2 attempts"):
            tool.invoke({"query": "q"})


def test_web_search_missing_key_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    with pytest.raises(ValueError, match="TAVILY_API_KEY"):
        web_search_tool()


def wiki(request: Recorded) -> Reply:
    if request.query.get("list") == ["search"]:
        return Reply(200, {"query": {"search": [{"title": "Paris"}, {"title": "Lyon"}]}})
    return Reply(
        200,
        {
            "query": {
                "pages": {
                    "1": {"title": "Paris", "extract": "Capital city."},
                    "2": {"title": "Lyon", "extract": "A city."},
                }
            }
        },
    )


def test_wikipedia_search_and_summaries_with_user_agent() -> None:
    with stand_in_server(wiki) as server:
        out = wikipedia_tool(endpoint=server.url + "/w/api.php").invoke({"query": "Paris"})
    assert out == "[1] Paris\nCapital city.\n\n[2] Lyon\nA city."
    assert server.requests[0].headers["User-Agent"].startswith("flowlearn/")
    assert server.requests[0].query["srsearch"] == ["Paris"]


def test_wikipedia_429_then_success_and_persistent_errors() -> None:
    flaky = {"n": 0}

    def respond(request: Recorded) -> Reply:
        flaky["n"] += 1
        return Reply(429, {}) if flaky["n"] == 1 else wiki(request)

    with stand_in_server(respond) as server:
        out = wikipedia_tool(endpoint=server.url, backoff=0.01).invoke({"query": "Paris"})
    assert out.startswith("[1] Paris")
    with (
        stand_in_server(scripted(Reply(401, {}))) as server,
        pytest.raises(ToolException, match="HTTP 401"),
    ):
        wikipedia_tool(endpoint=server.url).invoke({"query": "x"})
    with (
        stand_in_server(scripted(Reply(200, {}, delay=1.0))) as server,
        pytest.raises(ToolException, match="after 1 attempts"),
    ):
        wikipedia_tool(endpoint=server.url, timeout=0.2, retries=0).invoke({"query": "x"})


def test_wikipedia_no_match() -> None:
    with stand_in_server(scripted(Reply(200, {"query": {"search": []}}))) as server:
        assert wikipedia_tool(endpoint=server.url).invoke({"query": "zzz"}).startswith("No ")


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_secret_in_the_wikipedia_endpoint_stays_out_of_error_texts() -> None:
    key, password = f"wiki-{uuid.uuid4().hex}", f"pw-{uuid.uuid4().hex}"
    endpoint = f"http://reader:{password}@127.0.0.1:{closed_port()}/w/api.php?apikey={key}"
    tool_ = wikipedia_tool(endpoint=endpoint, retries=0, backoff=0)
    with pytest.raises(ToolException) as raised:
        tool_.invoke({"query": "Paris"})
    message = str(raised.value)
    assert "ConnectionError" in message and "/w/api.php" in message  # the URL is still named
    assert key not in message and password not in message

    @tool
    def leaky(query: str) -> str:
        """Fail with an error that quotes the endpoint."""
        raise RuntimeError(f"GET {endpoint.replace('?', '?lang=en&')} failed")

    graph = build_agentflow(
        ScriptedPolicy([plan("leaky")]), FakeChatModel(default_args={"query": "x"}), [leaky]
    )
    state = graph.invoke({"question": "q"}, context=Context(max_turns=1))
    (action,) = [r for r in state["memory"] if r["kind"] == "action"]
    assert action["error"].startswith("RuntimeError: GET http://[redacted]@127.0.0.1")
    assert key not in json.dumps(state, default=str) and password not in action["error"]
