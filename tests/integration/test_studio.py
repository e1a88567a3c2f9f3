"""`langgraph dev` serves the flow from langgraph.json; a langgraph_sdk client runs it.

One server (bound to 127.0.0.1) for the module: the flow runs, the python tool is off, and only
the Studio and localhost origins get a CORS grant; a foreign page's requests are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flowlearn.graphs import OutputState

ROOT = Path(__file__).parents[2]
CLI = Path(sys.executable).parent / "langgraph"

pytestmark = [
    pytest.mark.slow,  # a real `langgraph dev` server
    pytest.mark.skipif(
        not CLI.exists() and shutil.which("langgraph") is None,
        reason="langgraph-cli[inmem] is not installed (the dev extra installs it)",
    ),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


STUDIO = "https://smith.langchain.com"
FOREIGN = (
    "https://evil.example",
    "null",
    "http://localhost.evil.example",
    "https://localhost:3000",
)


@contextlib.contextmanager
def langgraph_dev(cwd: Path, env: dict[str, str], log_path: Path) -> Iterator[str]:
    """Run `langgraph dev` on 127.0.0.1 from `cwd` until the block ends; yield its URL.

    Raises:
        RuntimeError: the server did not answer `/ok` within 90 s, with its log's tail.

    """
    port = free_port()
    log = log_path.open("w")
    proc = subprocess.Popen(
        [
            str(CLI),
            "dev",
            "--no-browser",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-reload",
        ],
        cwd=cwd,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ok", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError(log_path.read_text()[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    tmp_path = tmp_path_factory.mktemp("studio")
    env = {**os.environ, "FLOWLEARN_PLANNER": str(tiny_model_dir), "LANGSMITH_TRACING": "false"}
    env.pop("FLOWLEARN_STUDIO_PYTHON", None)
    with langgraph_dev(ROOT, env, tmp_path / "server.log") as url:
        yield url


def test_langgraph_dev_serves_the_flow(server: str) -> None:
    from langgraph_sdk import get_client

    async def scenario() -> tuple[dict, list[dict]]:
        client = get_client(url=server)
        thread = await client.threads.create()
        context = {"max_turns": 1, "planner_max_new_tokens": 8}
        state = await client.runs.wait(
            thread["thread_id"],
            "agentflow",
            input={"question": "What is 17 * 23?"},
            context=context,
        )
        # a second question on the same thread starts a fresh run; the thread keeps the first
        second = await client.runs.wait(
            thread["thread_id"],
            "agentflow",
            input={"question": "What is 2 + 3?"},
            context=context,
        )
        kept = await client.threads.get_state(thread["thread_id"])
        history = await client.threads.get_history(thread["thread_id"], limit=100)
        state["second"], state["kept"], state["history"] = second, kept["values"], history
        events = []
        thread2 = await client.threads.create()
        async for part in client.runs.stream(
            thread2["thread_id"],
            "agentflow",
            input={"question": "What is 2 + 2?"},
            context=context,
            stream_mode="custom",
        ):
            if part.event == "custom":
                events.append(part.data)
        return state, events

    state, events = asyncio.run(scenario())
    second, kept, history = state.pop("second"), state.pop("kept"), state.pop("history")
    assert "__error__" not in state, state
    # clients get OutputState: the answer and how the run went, never token ids
    assert set(state) <= set(OutputState.__annotations__), set(state)
    assert "transitions" not in state and "question" in state and "memory" in state
    assert second["question"] == "What is 2 + 3?" and second["turn"] == 1
    assert all(record["turn"] == 1 for record in second["memory"])  # none of the first run's
    assert kept["transitions"] and all("17 * 23" not in str(t) for t in kept["transitions"])
    asked = {c["values"].get("question") for c in history}
    assert {"What is 17 * 23?", "What is 2 + 3?"} <= asked  # the checkpoints keep both runs
    assert state["turn"] == 1 and "answer" in state and state["final_text"] is not None
    assert state["termination"] in {"max_turns", "verifier_stop"}
    kinds = [e["event"] for e in events]
    assert kinds[0] == "planner" and kinds[-1] == "answer"
    assert "budget" in kinds or "verdict" in kinds


def preflight(client: httpx.Client, origin: str) -> httpx.Response:
    return client.options(
        "/threads",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        },
    )


def thread_count(client: httpx.Client) -> int:
    return len(client.post("/threads/search", json={"limit": 1000}).json())


@pytest.mark.parametrize("origin", FOREIGN)
def test_a_foreign_origin_gets_no_cors_grant_and_cannot_post(server: str, origin: str) -> None:
    with httpx.Client(base_url=server, timeout=10) as client:
        before = thread_count(client)
        answer = preflight(client, origin)
        assert answer.status_code == 403, answer.text
        assert "access-control-allow-origin" not in answer.headers
        assert "access-control-allow-private-network" not in answer.headers
        # A "simple" POST goes out without a preflight: it must be refused, not just unreadable.
        for content_type in ("text/plain", "application/x-www-form-urlencoded", "application/json"):
            answer = client.post(
                "/threads", content=b"{}", headers={"Origin": origin, "Content-Type": content_type}
            )
            assert answer.status_code == 403, answer.text
            assert "access-control-allow-origin" not in answer.headers
            assert "is not allowed" in answer.json()["detail"]
        assert thread_count(client) == before


@pytest.mark.parametrize("origin", [STUDIO, "http://localhost:5173", "http://127.0.0.1:3000"])
def test_studio_and_localhost_origins_get_the_grant(server: str, origin: str) -> None:
    with httpx.Client(base_url=server, timeout=10) as client:
        answer = preflight(client, origin)
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == origin
        assert answer.headers["access-control-allow-private-network"] == "true"
        assert "POST" in answer.headers["access-control-allow-methods"]
        answer = client.post("/threads", json={}, headers={"Origin": origin})
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == origin
        assert "thread_id" in answer.json()


def test_a_body_that_is_not_json_is_refused_even_without_an_origin(server: str) -> None:
    with httpx.Client(base_url=server, timeout=10) as client:
        before = thread_count(client)
        answer = client.post("/threads", content=b"{}", headers={"Content-Type": "text/plain"})
        assert answer.status_code == 415 and "must be JSON" in answer.json()["detail"]
        assert thread_count(client) == before
        assert client.get("/ok").status_code == 200  # reads without a body pass


def test_the_studio_graph_binds_no_python_tool(server: str) -> None:
    from langgraph_sdk import get_client

    async def scenario() -> dict:
        client = get_client(url=server)
        thread = await client.threads.create()
        return await client.runs.wait(
            thread["thread_id"],
            "agentflow",
            input={"question": "What is 17 * 23?"},
            context={"max_turns": 1, "tools": ["python"]},
            raise_error=False,
        )

    error = asyncio.run(scenario())["__error__"]
    assert "context.tools names ['python'], which are not bound" in error["message"]
    assert "python" not in error["message"].split("bound tools are")[1]
