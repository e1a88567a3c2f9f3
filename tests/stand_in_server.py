"""A real HTTP server on 127.0.0.1 that answers from a script, for testing web tools."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    delay: float = 0.0


@dataclass
class Recorded:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any


@dataclass
class StandIn:
    url: str
    requests: list[Recorded] = field(default_factory=list)


@contextmanager
def stand_in_server(respond: Callable[[Recorded], Reply]) -> Iterator[StandIn]:
    """Serve on a free port until the block ends; `respond` maps each request to a reply."""
    holder: dict[str, StandIn] = {}

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            parsed = urlparse(self.path)
            record = Recorded(
                self.command,
                parsed.path,
                parse_qs(parsed.query),
                dict(self.headers),
                json.loads(raw) if raw else None,
            )
            holder["server"].requests.append(record)
            reply = respond(record)
            time.sleep(reply.delay)
            payload = json.dumps(reply.body).encode()
            try:
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out first

        do_GET = do_POST = _handle

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    holder["server"] = StandIn(url=f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield holder["server"]
    finally:
        server.shutdown()
        server.server_close()
