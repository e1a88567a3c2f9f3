"""The command line tells the kinds of error apart: one line each, and its kind's exit status.

Every error of `flowlearn.errors` is filed under a kind (usage, data, model, training,
transient, setup); the CLI prints `flowlearn CMD: LABEL: message` and exits with the kind's
status, the traceback only under `--verbose`. docs/cli.md and `flowlearn --help` list the same.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from flowlearn import errors
from flowlearn.cli import COMMANDS, ERROR_KINDS, OTHER_ERROR, error_kind, exit_statuses, main
from flowlearn.errors import (
    AdapterError,
    DataError,
    FlowlearnError,
    ModelNotFoundError,
    SandboxUnavailableError,
    SavedModelError,
    ServerError,
    ServerReplyError,
    TrainingDivergedError,
    TransientEngineError,
    TransientSearchError,
    UsageError,
)

ROOT = Path(__file__).parents[2]

CASES = [
    (UsageError("--tools names 'pyhton'"), 2, "error"),
    (DataError("runs.jsonl:2: field reward is NaN"), 65, "data error"),
    (ModelNotFoundError("no model at ./ckpt"), 69, "model error"),
    (SavedModelError("checkpoint holds pickled Python objects"), 69, "model error"),
    (AdapterError("the server refused the adapter"), 69, "model error"),
    (ServerError(401, "bad token", url="http://h:8000/v1"), 69, "model error"),
    (ServerReplyError("the reply is not JSON"), 69, "model error"),
    (TrainingDivergedError("step 3: the loss is nan"), 70, "training stopped"),
    (TransientEngineError("read timeout"), 75, "temporary error"),
    (TransientSearchError("rate limited"), 75, "temporary error"),
    (SandboxUnavailableError("bwrap cannot build the sandbox"), 78, "setup error"),
    (FlowlearnError("something else"), 1, "error"),
]
"""An error of each class, its exit status and the word its line names it by."""

BUILTIN_BASES = {
    UsageError: ValueError,
    DataError: ValueError,
    SavedModelError: ValueError,
    ModelNotFoundError: RuntimeError,
    SandboxUnavailableError: RuntimeError,
    ServerError: RuntimeError,
    ServerReplyError: RuntimeError,
    AdapterError: RuntimeError,
    TrainingDivergedError: RuntimeError,
}
"""The built-in error each has always been, which `except ValueError:` code still relies on."""


def fail_with(monkeypatch: pytest.MonkeyPatch, error: FlowlearnError) -> None:
    """Register `flowlearn fail [--verbose]`, a subcommand whose command raises `error`."""
    module = types.ModuleType("fail_command")

    def add_parser(commands: Any) -> None:
        commands.add_parser("fail").add_argument("--verbose", action="store_true")

    def fail_command(args: argparse.Namespace) -> int:
        raise error

    vars(module).update(add_parser=add_parser, fail_command=fail_command)
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setitem(COMMANDS, "fail", module.__name__)


@pytest.mark.parametrize(("error", "status", "label"), CASES, ids=lambda c: type(c).__name__)
def test_each_kind_exits_with_its_status_and_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    error: FlowlearnError,
    status: int,
    label: str,
) -> None:
    assert error_kind(error).status == status
    fail_with(monkeypatch, error)
    got = main(["fail"])
    err = capsys.readouterr().err.splitlines()
    assert got == status
    assert len(err) == 1 and err[0].startswith(f"flowlearn fail: {label}: {error}"), err
    assert "Traceback" not in err[0]


def test_a_transient_error_says_to_run_again(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fail_with(monkeypatch, TransientEngineError("read timeout"))
    assert main(["fail"]) == 75
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("flowlearn fail: temporary error: read timeout (temporary: run the")


@pytest.mark.parametrize("verbose", [False, True])
def test_the_line_is_one_line_redacted_and_the_traceback_only_verbose(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], verbose: bool
) -> None:
    secret = "fake-cli-test-key-" + "a1B2" * 6
    monkeypatch.setenv("FLOWLEARN_TEST_API_KEY", secret)
    fail_with(monkeypatch, SandboxUnavailableError(f"bwrap said:\nno\n{secret}"))
    assert main(["fail", *(["--verbose"] if verbose else [])]) == 78
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[-1].startswith("flowlearn fail: setup error: bwrap said: no ")
    assert secret not in err
    if verbose:  # where it was raised, before the line
        assert lines[0].startswith("Traceback") and "in fail_command" in err
    else:
        assert len(lines) == 1


def test_every_error_class_has_a_kind_and_keeps_its_builtin_base() -> None:
    classes = {
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, FlowlearnError) and c.__module__ == errors.__name__
    }
    kinds = {kind.error for kind in ERROR_KINDS}
    specific = classes - kinds - {FlowlearnError}
    assert specific == {type(error) for error, _, _ in CASES} - kinds - {FlowlearnError}
    for cls in specific:  # each under exactly one kind
        assert sum(issubclass(cls, kind.error) for kind in ERROR_KINDS) == 1, cls
    for cls, builtin in BUILTIN_BASES.items():
        assert issubclass(cls, builtin), cls
    statuses = [kind.status for kind in (*ERROR_KINDS, OTHER_ERROR)]
    assert len(set(statuses)) == len(statuses) and 0 not in statuses


def test_the_docs_and_help_list_the_same_statuses() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| `([\w ]+)` \|", page, flags=re.MULTILINE)
    table = {(str(k.status), k.error.__name__, k.label) for k in (*ERROR_KINDS, OTHER_ERROR)}
    assert set(rows) == table
    for error, status, _ in CASES:  # each specific class is listed under its own status
        row = next(line for line in page.splitlines() if line.startswith(f"| {status} |"))
        assert f"`{type(error).__name__}`" in row, (type(error).__name__, row)
    shown = exit_statuses()
    for kind in (*ERROR_KINDS, OTHER_ERROR):
        assert re.search(rf"^  {kind.status} +{kind.error.__name__} ", shown, re.MULTILINE)
