"""The errors flowlearn raises on purpose: one base, a few kinds, and the specific errors.

A kind says what the user has to fix, and the `flowlearn` command exits with its own status
(the table is `flowlearn.cli.ERROR_KINDS`): a bad option or name (`UsageError`), a bad record in
a data file (`DataError`), a model, adapter or server that cannot be used (`ModelError`), a
training run that stopped (`TrainingError`), a temporary failure worth running again
(`TransientError`), or this machine lacking something (`SetupError`). Each specific error below
derives from its kind, and also from the built-in error it has always been (`ValueError`,
`RuntimeError`), so code that caught those keeps working.
"""

from __future__ import annotations

from collections.abc import Sequence


class FlowlearnError(Exception):
    """Base of every error flowlearn raises on purpose; its message says what to fix."""


# ---- the kinds: what the user has to fix -------------------------------------------------------


class UsageError(FlowlearnError, ValueError):
    """A bad name, option or setting: the command line or a config names something not there."""


class DataError(FlowlearnError, ValueError):
    """A data file holds a record flowlearn must not use; the message names file, line, field."""


class ModelError(FlowlearnError):
    """A model, adapter, saved checkpoint or generation server that cannot be used as asked."""


class TrainingError(FlowlearnError):
    """A training run stopped on what it met while training; nothing unsound was saved."""


class TransientError(FlowlearnError):
    """A failure worth a later try (rate limit, timeout, lost connection) that outlasted retries."""


class SetupError(FlowlearnError):
    """Something a command needs is missing here (a sandbox, vLLM); the message says what to do."""


# ---- the specific errors, each under its kind -------------------------------------------------


class ModelNotFoundError(ModelError, RuntimeError):
    """No model could be found where the user (or the default) pointed."""


class SandboxUnavailableError(SetupError, RuntimeError):
    """The host cannot isolate the `python` tool's code; the message says why and what to do."""


class ServerError(ModelError, RuntimeError):
    """A generation server answered with an error status; `status_code` tells retries what it was.

    The caller redacts the message (a 401 body may echo the bearer token).
    """

    def __init__(self, status_code: int, message: str, *, url: str | None = None) -> None:
        where = f" at {url}" if url else ""
        super().__init__(f"generation server{where} answered {status_code}: {message}")
        self.status_code = status_code


class ServerReplyError(ModelError, RuntimeError):
    """A generation server's reply could not be used: past its deadline, too large, or malformed.

    Never retried: the same request would spend the same time or bring the same reply. The
    message names the server (its URL redacted) and what was wrong; nodes record it as the
    call's engine error.
    """


class TransientEngineError(TransientError):
    """A transient model error that outlasted its retries; `__cause__` is the last one raised."""


class TransientSearchError(TransientError):
    """A web search failure worth retrying: rate limit, timeout, connection or server error."""


class AdapterError(ModelError, RuntimeError):
    """The planner server could not take an adapter; the message says why and what to change."""


class TrainingDivergedError(TrainingError, RuntimeError):
    """Training met a non-finite loss, gradient norm or weight, and stopped before saving it."""


class SavedModelError(ModelError, ValueError):
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
