"""Retries of model calls, bound into each node when it is built.

Each node factory takes a LangGraph `RetryPolicy` and wraps its own model calls with it
(`retrying`), so a graph composed by hand from the factories survives transient engine faults
exactly like the default graph: no graph-level policy, no context variable. The waiting and
stopping are tenacity's (the library behind LangChain's `with_retry`); `with_retry` itself is not
used because it takes exception types only (transient HTTP errors are told apart by status code)
and returns a Runnable without `bind_tools`, which the executor needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import tenacity
from langgraph.types import RetryPolicy

from flowlearn.errors import TransientEngineError
from flowlearn.secrets import error_text, redact

P = ParamSpec("P")
T = TypeVar("T")

TRANSIENT_NAMES = frozenset(
    {
        "APIConnectionError",
        "APITimeoutError",
        "ConnectError",
        "ConnectTimeout",
        "InternalServerError",
        "RateLimitError",
        "ReadTimeout",
        "ServiceUnavailableError",
    }
)


def is_transient(exc: BaseException) -> bool:
    """Whether an engine error is worth retrying: timeouts, dropped connections, 429 and 5xx.

    A served call past its whole deadline, over its size cap or with a malformed reply
    (`ServerReplyError`) is not: a retry would spend the same time or get the same reply.
    """
    if isinstance(exc, TimeoutError | ConnectionError):
        return True
    status = getattr(exc, "status_code", None) or getattr(
        getattr(exc, "response", None), "status_code", None
    )
    return type(exc).__name__ in TRANSIENT_NAMES or status in {429, 500, 502, 503, 504}


ENGINE_RETRY = RetryPolicy(
    initial_interval=0.5, backoff_factor=2.0, max_attempts=3, jitter=True, retry_on=is_transient
)
"""Retry a model call that hit a transient error (timeout, dropped connection, 429/5xx)."""


def _matches(policy: RetryPolicy, exc: BaseException) -> bool:
    retry_on = policy.retry_on
    if isinstance(retry_on, type):
        return isinstance(exc, retry_on)
    if isinstance(retry_on, Sequence):
        return isinstance(exc, tuple(retry_on))
    return bool(retry_on(exc))  # type: ignore[arg-type]


def retrying(call: Callable[P, T], policy: RetryPolicy | None) -> Callable[P, T]:
    """Return `call` retried on the errors `policy` names, with its backoff and attempts.

    When the attempts are spent on transient errors (or `policy` is None and the error is
    transient by `is_transient`), `TransientEngineError` is raised from the last error; any
    other error is raised at once, unchanged.
    """
    transient = is_transient if policy is None else lambda exc: _matches(policy, exc)
    attempts = 1 if policy is None else max(policy.max_attempts, 1)
    wait: tenacity.wait.wait_base = tenacity.wait_none()
    if policy is not None:
        wait = tenacity.wait_exponential(
            multiplier=policy.initial_interval,
            exp_base=policy.backoff_factor,
            max=policy.max_interval,
        )
        if policy.jitter:
            wait = wait + tenacity.wait_random(0, 1)

    def call_with_retries(*args: P.args, **kwargs: P.kwargs) -> T:
        retryer = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(attempts),
            wait=wait,
            retry=tenacity.retry_if_exception(transient),
            reraise=True,
        )
        try:
            return retryer(call, *args, **kwargs)
        except Exception as exc:
            if transient(exc):
                raise TransientEngineError(redact(str(exc))) from exc
            raise

    return call_with_retries


def engine_error(exc: BaseException, caller: str = "the engine") -> str:
    """Return the message recorded for a failed model call (retries already spent).

    `caller` names what failed ("the planner's policy"). Known secrets are redacted
    (`flowlearn.secrets`): a server's 401 may echo its token.
    """
    if isinstance(exc, TransientEngineError) and exc.__cause__ is not None:
        return f"{caller} failed (transient; retries exhausted): {error_text(exc.__cause__)}"
    return f"{caller} failed: {error_text(exc)}"


def with_retries(
    call: Callable[[], T],
    *,
    transient: tuple[type[BaseException], ...],
    retries: int = 2,
    backoff: float = 0.5,
) -> T:
    """Return `call()`, retrying up to `retries` times when it raises a `transient` error.

    Waits `backoff`, then twice that, and so on; the last error propagates (the web tools),
    its message with known secrets redacted when it is one of the `transient` kinds.
    """
    retryer = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(retries + 1),
        wait=tenacity.wait_exponential(multiplier=backoff, exp_base=2, min=backoff),
        retry=tenacity.retry_if_exception_type(transient),
        reraise=True,
    )
    try:
        return retryer(call)
    except transient as exc:
        exc.args = tuple(redact(a) if isinstance(a, str) else a for a in exc.args)
        raise
