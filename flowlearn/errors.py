"""The errors flowlearn raises on purpose: one base, and a few kinds the CLI turns into messages.

Each also derives from the built-in error it has always been (`ValueError`, `RuntimeError`), so
code that caught those keeps working. `flowlearn` exits 2 on a `UsageError` (the command line
or a config names something that is not there) and 1 on any other `FlowlearnError`, printing
its message (secrets redacted) instead of a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence


class FlowlearnError(Exception):
    """Base of every error flowlearn raises on purpose; its message says what to fix."""


class UsageError(FlowlearnError, ValueError):
    """A bad name, option or setting; the CLI prints it and exits with status 2."""


class ModelNotFoundError(FlowlearnError, RuntimeError):
    """No model could be found where the user (or the default) pointed."""


class SandboxUnavailableError(FlowlearnError, RuntimeError):
    """The host cannot isolate the `python` tool's code; the message says why and what to do."""


class ServerError(FlowlearnError, RuntimeError):
    """A generation server answered with an error status; `status_code` tells retries what it was.

    The caller redacts the message (a 401 body may echo the bearer token).
    """

    def __init__(self, status_code: int, message: str, *, url: str | None = None) -> None:
        where = f" at {url}" if url else ""
        super().__init__(f"generation server{where} answered {status_code}: {message}")
        self.status_code = status_code


class ServerReplyError(FlowlearnError, RuntimeError):
    """A generation server's reply could not be used: past its deadline, too large, or malformed.

    Never retried: the same request would spend the same time or bring the same reply. The
    message names the server (its URL redacted) and what was wrong; nodes record it as the
    call's engine error.
    """


class TransientEngineError(FlowlearnError):
    """A transient model error that outlasted its retries; `__cause__` is the last one raised."""


class TransientSearchError(FlowlearnError):
    """A web search failure worth retrying: rate limit, timeout, connection or server error."""


class AdapterError(FlowlearnError, RuntimeError):
    """The planner server could not take an adapter; the message says why and what to change."""


class DataError(FlowlearnError, ValueError):
    """A data file holds a record flowlearn must not use; the message names file, line, field."""


class TrainingDivergedError(FlowlearnError, RuntimeError):
    """Training met a non-finite loss, gradient norm or weight, and stopped before saving it."""


class SavedModelError(FlowlearnError, ValueError):
    """A saved model, adapter or checkpoint flowlearn must not load; the message says why and how.

    Another base's adapters, an adapter larger than its base allows, a checkpoint that pickles
    Python objects, or a record that is not one: refused before anything is allocated or run.
    """


def brief(names: Sequence[object], most: int = 10) -> str:
    """Return names for a message: the first `most`, and how many there are in all.

    An error naming every one of 200,001 node names printed them all.

    >>> brief(["a", "b", "c"], most=2)
    "['a', 'b', ...] (3 in all)"
    """
    shown = [str(name)[:80] for name in list(names[:most])]
    if len(names) <= most:
        return str(shown)
    return f"{str(shown)[:-1]}, ...] ({len(names):,} in all)"
