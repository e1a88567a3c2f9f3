"""The HTTP guard `langgraph dev` mounts (langgraph.json `http.app`): other sites' pages refused."""

from __future__ import annotations

import re
from collections.abc import Collection

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flowlearn.compose.names import STUDIO_HOSTS_ENV, studio_hosts
from flowlearn.nodes.schema.context import MAX_QUESTION_CHARS, QUESTION_CHARS

_BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest request body the server reads: a question at `MAX_QUESTION_CHARS` (1,000,000
characters, about 1 MB of JSON) fits with room for its context, and the graph refuses one over
its own bound with a clear error. Without it a 40 MB question was read, stored and tokenised
until the kernel killed the server (11 GB)."""
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
"""The `Host:` names a local server answers to; `$FLOWLEARN_STUDIO_HOSTS` adds more."""
HOSTS_ENV = STUDIO_HOSTS_ENV


def host_name(host: str) -> str:
    """Return a `Host:` header's name without its port, lower-cased (`[::1]:2024` -> `[::1]`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class OriginGuard:
    """Refuse what a web page of another site could make the server do, before CORS runs.

    CORS alone only decides whether a page may *read* a reply, so:

    1. A request whose `Origin` the CORS grant does not allow is refused with 403. A "simple"
       request (a POST of text/plain, form or multipart data) is sent without a preflight, and
       LangGraph parses its body as JSON whatever its type: without this, the run would start.
       Preflights are refused the same way, and WebSockets, which CORS does not cover at all.
    2. A request with a body must be JSON (415 otherwise). Browsers send JSON across origins
       only after a preflight, so even a page whose browser leaves `Origin` out cannot post.

    Requests without `Origin` (the SDK, curl) pass: browsers send one with every cross-origin
    request that can change state. `Origin: null` (sandboxed frames, `file:` pages) is foreign.

    3. A request whose `Host:` is not a name of this machine (`allow_hosts`: localhost,
       127.0.0.1 and [::1] unless told more) is refused with 421, WebSockets included. A page
       on a DNS-rebinding name resolves to 127.0.0.1 and is same-origin with itself, so it
       sends no foreign `Origin` on a GET; its `Host:` still names it.
    4. A body over `max_body_bytes` is refused with 413: by its `Content-Length` before a byte
       is read, and a body sent without one is cut off where it passes the bound (the server
       sees the client go), so no input, thread state or memory grows the server unbounded.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        allow_origins: Collection[str],
        allow_origin_regex: str | None = None,
        allow_hosts: Collection[str] = LOCAL_HOSTS,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        if "*" in allow_origins or not (allow_origins or allow_origin_regex):
            raise ValueError(
                "OriginGuard needs explicit origins: set langgraph.json's http.cors "
                "allow_origins (without '*') or allow_origin_regex"
            )
        self.app = app
        self.allow_origins = frozenset(allow_origins)
        self.allow_origin_regex = re.compile(allow_origin_regex) if allow_origin_regex else None
        self.allow_hosts = frozenset(host_name(h) for h in allow_hosts)
        self.max_body_bytes = max_body_bytes

    def allows(self, origin: str) -> bool:
        """Match an origin as Starlette's CORSMiddleware does: listed, or the regex in full."""
        pattern = self.allow_origin_regex
        return origin in self.allow_origins or bool(pattern and pattern.fullmatch(origin))

    def refusal(self, scope: Scope) -> tuple[int, str] | None:
        """Return the status and reason to refuse this request with, or None to let it in."""
        headers = Headers(scope=scope)
        host = headers.get("host")
        if host is not None and host_name(host) not in self.allow_hosts:
            return 421, (
                f"host {host!r} is not a name of this server (DNS rebinding?); it answers to "
                f"{', '.join(sorted(self.allow_hosts))}; add names to ${HOSTS_ENV} "
                "(e.g. a tunnel's)"
            )
        origin = headers.get("origin")
        if origin is not None and not self.allows(origin):
            return 403, (
                f"origin {origin!r} is not allowed; this server admits LangGraph Studio and "
                "localhost pages (langgraph.json http.cors), and clients that send no Origin"
            )
        has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
        length = headers.get("content-length", "0").strip()
        if not length.isdigit():
            return 400, f"Content-Length {length[:40]!r} is not a number of bytes"
        if int(length) > self.max_body_bytes:
            return 413, self.too_large(length)
        if scope["type"] == "http" and scope["method"] in _BODY_METHODS and has_body:
            media = headers.get("content-type", "").split(";")[0].strip().lower()
            if media != "application/json" and not media.endswith("+json"):
                return 415, (
                    f"a request body must be JSON (Content-Type: application/json), "
                    f"got {media or 'no Content-Type'!r}"
                )
        return None

    def too_large(self, length: str) -> str:
        """Say that a body of `length` bytes is over the bound, and what the bound is for."""
        return (
            f"the request body ({length} bytes) is over the {self.max_body_bytes:,} bytes this "
            f"server reads; a question may have {QUESTION_CHARS:,} characters (the context's "
            f"max_question_chars, at most {MAX_QUESTION_CHARS:,})"
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on, or answer it with the refusal (no CORS headers)."""
        refused = self.refusal(scope) if scope["type"] in {"http", "websocket"} else None
        if refused is None and scope["type"] == "http":
            await self.bounded(scope, receive, send)
        elif refused is None:
            await self.app(scope, receive, send)
        elif scope["type"] == "websocket":  # closing before accepting answers HTTP 403
            await send({"type": "websocket.close", "code": 1008, "reason": refused[1][:120]})
        else:
            status, reason = refused
            await JSONResponse({"detail": reason}, status_code=status)(scope, receive, send)

    async def bounded(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass an HTTP request on, counting its body: past the bound the client is gone."""
        seen, over, started = 0, False, False

        async def counted() -> Message:
            nonlocal seen, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body_bytes:  # streamed without a Content-Length
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            if not over:  # past the bound the app's own answer is dropped: ours goes instead
                started = started or message["type"] == "http.response.start"
                await send(message)

        try:
            await self.app(scope, counted, watched)
        except Exception:  # the app's own end for a client gone mid-body (ClientDisconnect)
            if not over:
                raise
        if over and not started:
            reply = JSONResponse({"detail": self.too_large(f"over {seen:,}")}, status_code=413)
            await reply(scope, receive, send)


def guard_as_served(app: ASGIApp) -> OriginGuard:
    """Wrap `app` in a guard that admits exactly the origins the server's CORS grant allows.

    The rule is declared once, in langgraph.json's `http.cors`; this reads the server's own
    parse of it when the server builds its middleware (at start-up, so a missing rule stops
    the server). Imported here, not at the top: only a LangGraph server has `langgraph_api`.
    """
    from langgraph_api.config import CORS_CONFIG  # type: ignore[import-untyped]

    cors = CORS_CONFIG or {}
    extra = studio_hosts()
    return OriginGuard(
        app,
        allow_origins=list(cors.get("allow_origins") or ()),
        allow_origin_regex=cors.get("allow_origin_regex"),
        allow_hosts=[*LOCAL_HOSTS, *extra],
    )


app = Starlette(middleware=[Middleware(guard_as_served)])
"""Mounted by `langgraph dev` (langgraph.json `http.app`); it adds no routes, only the guard,
which the server places outside its own CORS and private-network middleware."""
