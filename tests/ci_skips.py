"""Under CI (`CI=true`), a test skipped for a missing dependency fails the run.

CI installs every extra (`make install`), so a skip there means a test that silently stopped
running: 118 training tests once passed as skips where trl was missing. Loaded by conftest.py
(`pytest_plugins`); `pytest -p ci_skips` loads it alone.
"""

from __future__ import annotations

import os

import pytest

MISSING = ("could not import", "is not installed")
"""Skip reasons that mean a dependency is missing (`pytest.importorskip` and our own skipifs)."""


def _under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _fail_missing_dependency(report: pytest.CollectReport | pytest.TestReport) -> None:
    """Under CI, turn a skip for a missing dependency into a failure that names it: CI installs
    every extra, so such a skip means a test that silently stopped running."""
    if not (_under_ci() and report.skipped and isinstance(report.longrepr, tuple)):
        return
    reason = str(report.longrepr[2])
    if any(marker in reason for marker in MISSING):
        report.outcome = "failed"
        report.longrepr = (
            f"skipped for a missing dependency under CI ({reason}); CI installs every extra "
            "(make install), so install it or unset CI to skip"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_missing_dependency(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_missing_dependency(outcome.get_result())
