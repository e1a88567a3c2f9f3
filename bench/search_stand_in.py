"""A stand-in for Tavily's search API on 127.0.0.1: real HTTP, a set latency, concurrent calls.

`web_search_tool(api_key=..., base_url=server.url)` searches it as it would search Tavily: a
`POST /search` with the key as a bearer token, answered with Tavily's JSON (`results`, each
with `title`, `url`, `content`, `score`). Each call takes `latency` seconds (web search is
typically 1-2 s a call), and calls are served on threads of their own (`ThreadingHTTPServer`),
so concurrent rollouts wait on their searches at once, as they would on the real service.
The server counts the calls it answered and the most it had in flight at once (`peak`).

It lives in bench/ (bench/async_training.py measures against it) and the tests import it from
here: the benches never import from tests/ (tests/unit/test_layout.py).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEFAULT_LATENCY = 1.0
"""Seconds a search takes: the low end of a real web search's 1-2 s."""


@dataclass
class SearchStandIn:
    """A running stand-in: where it listens, and what it has seen."""

    url: str
    """The API root to give `web_search_tool(base_url=...)`."""
    latency: float
    """Seconds each search takes."""
    gather: int = 0
    """Hold each search until this many are in flight at once (0: never hold)."""
    gather_timeout: float = 5.0
    """Seconds a held search waits for the others before it gives up holding (then none do)."""
    queries: list[str] = field(default_factory=list)
    """Every query answered, in arrival order."""
    in_flight: int = 0
    """Searches being answered now."""
    peak: int = 0
    """The most searches that were in flight at once."""
    condition: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def reset(self) -> None:
        """Forget the queries and the peak (between the runs of a bench)."""
        with self.condition:
            self.queries.clear()
            self.peak = self.in_flight

    def arrive(self, query: str) -> None:
        """Count a search in; hold it until `gather` are in flight, if asked."""
        with self.condition:
            self.queries.append(query)
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.condition.notify_all()
            if self.gather and not self.condition.wait_for(
                lambda: self.in_flight >= self.gather or not self.gather, self.gather_timeout
            ):
                self.gather = 0  # they never all came: release every held search
                self.condition.notify_all()

    def leave(self) -> None:
        """Count a search out."""
        with self.condition:
            self.in_flight -= 1


def tavily_results(query: str, count: int) -> dict[str, Any]:
    """Tavily's `/search` reply for `query`: `count` results, each with title, url and content."""
    results = [
        {
            "title": f"Result {rank} for {query}"[:120],
            "url": f"https://search.stand-in.test/{rank}",
            "content": f"A passage about {query} (stand-in result {rank}).",
            "score": round(1.0 / rank, 3),
            "raw_content": None,
        }
        for rank in range(1, count + 1)
    ]
    return {
        "query": query,
        "follow_up_questions": None,
        "answer": None,
        "images": [],
        "results": results,
        "response_time": 0.0,
        "request_id": uuid.uuid4().hex,
    }


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # socketserver's 5 would drop a burst of connects (a 1 s SYN retry)


def _handler(state: SearchStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if self.path.rstrip("/") != "/search":
                return self.reply(404, {"detail": {"error": f"no such endpoint {self.path}"}})
            if not self.headers.get("Authorization", "").startswith("Bearer "):
                return self.reply(401, {"detail": {"error": "Unauthorized: missing API key."}})
            query = str(body.get("query", ""))
            began = time.perf_counter()
            state.arrive(query)
            try:
                time.sleep(state.latency)
                reply = tavily_results(query, int(body.get("max_results") or 5))
                reply["response_time"] = round(time.perf_counter() - began, 3)
                self.reply(200, reply)
            finally:
                state.leave()

        def reply(self, status: int, data: dict[str, Any]) -> None:
            payload = json.dumps(data).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up first (its timeout)

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def search_stand_in(
    latency: float = DEFAULT_LATENCY, *, gather: int = 0, gather_timeout: float = 5.0
) -> Iterator[SearchStandIn]:
    """Serve Tavily's search on a free port of 127.0.0.1 until the block ends.

    Args:
        latency: seconds each search takes.
        gather: hold each search until this many are in flight at once, so a test can say
            that calls overlap without timing them (0: never hold).
        gather_timeout: seconds a held search waits; after that nothing is held any more.

    """
    if latency < 0:
        raise ValueError(f"latency must be >= 0 seconds, got {latency}")
    state = SearchStandIn("", latency, gather, gather_timeout)
    server = _Server(("127.0.0.1", 0), _handler(state))
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, name="search-stand-in", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
