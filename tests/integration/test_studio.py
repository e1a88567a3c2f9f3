"""`langgraph dev` serves the flow from langgraph.json; a langgraph_sdk client runs it."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
CLI = Path(sys.executable).parent / "langgraph"

pytestmark = pytest.mark.skipif(
    not CLI.exists() and shutil.which("langgraph") is None,
    reason="langgraph-cli[inmem] is not installed (the dev extra installs it)",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def server(tiny_model_dir: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    env = {**os.environ, "FLOWLEARN_PLANNER": str(tiny_model_dir), "LANGSMITH_TRACING": "false"}
    log = (tmp_path / "server.log").open("w")
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
        cwd=ROOT,
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
                raise RuntimeError((tmp_path / "server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


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
    assert "__error__" not in state, state
    assert state["turn"] == 1 and "answer" in state and state["final_text"] is not None
    assert state["termination"] in {"max_turns", "verifier_stop"}
    kinds = [e["event"] for e in events]
    assert kinds[0] == "planner" and kinds[-1] == "answer"
    assert "budget" in kinds or "verdict" in kinds
