"""The Studio server's guard (langgraph.json's rule) and the python tool off in the Studio graph."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="starlette is not installed (the studio extra brings it)")

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from fakes import FakeChatModel
from flowlearn.compose import STUDIO_PYTHON_ENV, FlowSpec, UsageError, build_tools, check_names
from flowlearn.studio_http import LOCAL_HOSTS, OriginGuard

ROOT = Path(__file__).parents[2]
CORS = json.loads((ROOT / "langgraph.json").read_text(encoding="utf-8"))["http"]["cors"]


def guarded_client() -> TestClient:
    async def threads(request: Request) -> JSONResponse:
        return JSONResponse({"created": True})

    async def events(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("event")
        await websocket.close()

    inner = Starlette(
        routes=[Route("/threads", threads, methods=["POST"]), WebSocketRoute("/events", events)]
    )
    guard = OriginGuard(
        inner,
        allow_origins=CORS["allow_origins"],
        allow_origin_regex=CORS["allow_origin_regex"],
        allow_hosts=[*LOCAL_HOSTS, "testserver"],  # Starlette's client opens ws://testserver
    )
    return TestClient(guard, base_url="http://127.0.0.1:2024")


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("https://smith.langchain.com", True),
        ("http://localhost:2024", True),
        ("http://localhost", True),
        ("http://127.0.0.1:5173", True),
        ("https://evil.example", False),
        ("null", False),
        ("http://smith.langchain.com", False),
        ("https://smith.langchain.com.evil.example", False),
        ("http://localhost.evil.example", False),
        ("http://localhost:2024.evil.example", False),
        ("http://127.0.0.1.evil.example:80", False),
        ("https://localhost:3000", False),
    ],
)
def test_the_shipped_rule_admits_studio_and_localhost_only(origin: str, allowed: bool) -> None:
    client = guarded_client()
    answer = client.post("/threads", json={}, headers={"Origin": origin})
    assert answer.status_code == (200 if allowed else 403), answer.text
    assert ("is not allowed" in answer.text) is not allowed


def test_a_websocket_from_a_foreign_page_is_refused() -> None:
    client = guarded_client()
    with pytest.raises(WebSocketDisconnect) as refused:  # noqa: SIM117
        with client.websocket_connect("/events", headers={"Origin": "https://evil.example"}):
            pass
    assert refused.value.code == 1008
    with client.websocket_connect("/events", headers={"Origin": "http://localhost:2024"}) as ws:
        assert ws.receive_text() == "event"


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("application/json", 200),
        ("application/json; charset=utf-8", 200),
        ("application/merge-patch+json", 200),
        ("text/plain", 415),
        ("text/plain;charset=UTF-8", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        (None, 415),
    ],
)
def test_a_body_must_be_json(content_type: str | None, status: int) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    answer = guarded_client().post("/threads", content=b"{}", headers=headers)
    assert answer.status_code == status, answer.text


def test_the_guard_refuses_a_rule_that_admits_everyone() -> None:
    with pytest.raises(ValueError, match="explicit origins"):
        OriginGuard(Starlette(), allow_origins=["*"])
    with pytest.raises(ValueError, match="explicit origins"):
        OriginGuard(Starlette(), allow_origins=[])


@pytest.mark.parametrize(
    ("http", "admitted"),
    [
        (None, None),
        ({"cors": {"allow_origins": ["*"]}}, None),
        ({"cors": CORS}, "frozenset({'https://smith.langchain.com'})"),
    ],
)
def test_the_served_guard_takes_the_servers_rule_or_stops_it(
    http: dict | None, admitted: str | None
) -> None:
    """`guard_as_served` reads langgraph_api's parse of langgraph.json; no rule, no server."""
    code = "from flowlearn.studio_http import guard_as_served as g; print(g(None).allow_origins)"
    env = {k: v for k, v in os.environ.items() if k not in {"LANGGRAPH_HTTP", "CORS_CONFIG"}}
    # What `langgraph dev` sets before langgraph_api.config is read (in-memory runtime).
    env |= {"REDIS_URI": "fake", "DATABASE_URI": ":memory:", "MIGRATIONS_PATH": "__inmem"}
    if http is not None:
        env["LANGGRAPH_HTTP"] = json.dumps(http)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    if admitted is None:
        assert done.returncode != 0 and "set langgraph.json's http.cors" in done.stderr
    else:
        assert done.returncode == 0 and done.stdout.strip() == admitted, done.stderr


def test_python_is_off_in_the_studio_graph_unless_enabled() -> None:
    assert "python" not in FlowSpec.for_studio({}).bound_tools()
    assert "python" not in FlowSpec.for_studio({STUDIO_PYTHON_ENV: "0"}).bound_tools()
    assert "python" in FlowSpec.for_studio({STUDIO_PYTHON_ENV: "1"}).bound_tools()
    assert "python" in FlowSpec.from_env({}).bound_tools()  # the CLI's spec keeps it
    off = FlowSpec.for_studio({"FLOWLEARN_WEB_TOOLS": "0"})
    assert [t.name for t in build_tools(off, FakeChatModel())] == ["local_search", "generalist"]
    with pytest.raises(UsageError, match=f"{STUDIO_PYTHON_ENV}=1"):
        check_names(off, tools=["python"])


def test_a_body_over_the_bound_is_refused_before_the_server_reads_it() -> None:
    from flowlearn.nodes.schema.context import MAX_QUESTION_CHARS
    from flowlearn.studio_http import MAX_BODY_BYTES

    read: list[int] = []

    async def runs(request: Request) -> JSONResponse:
        read.append(len(await request.body()))
        return JSONResponse({"started": True})

    inner = Starlette(routes=[Route("/runs", runs, methods=["POST"])])
    guard = OriginGuard(inner, allow_origins=CORS["allow_origins"], max_body_bytes=1000)
    client = TestClient(guard, base_url="http://127.0.0.1:2024")
    headers = {"Content-Type": "application/json"}
    big = json.dumps({"input": {"question": "7" * 2000}}).encode()
    answer = client.post("/runs", content=big, headers=headers)  # with its Content-Length
    assert answer.status_code == 413 and "max_question_chars" in answer.json()["detail"]

    def streamed() -> Any:  # no Content-Length: counted as it arrives
        yield big[:600]
        yield big[600:]

    answer = client.post("/runs", content=streamed(), headers=headers)
    assert answer.status_code == 413 and read == []  # the app never got the body
    assert client.post("/runs", content=b'{"input": {}}', headers=headers).status_code == 200
    assert read == [len(b'{"input": {}}')]
    # the default admits a question at the ceiling, and refuses the 40 MB that killed a server
    assert len(json.dumps({"input": {"question": "7" * MAX_QUESTION_CHARS}})) < MAX_BODY_BYTES
    assert MAX_BODY_BYTES < 40 * 10**6
