"""Under CI a test skipped for a missing dependency fails; elsewhere it still skips."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]


def run(folder: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"} | {"PYTHONPATH": str(TESTS)}
    if ci is not None:
        env["CI"] = ci
    command = [sys.executable, "-m", "pytest", "-q", "-p", "ci_skips", "-p", "no:cacheprovider"]
    return subprocess.run(
        [*command, str(folder)],
        capture_output=True,
        text=True,
        env=env,
        cwd=TESTS.parent,
        timeout=120,
    )


@pytest.mark.slow
def test_a_missing_dependency_fails_under_ci_and_skips_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "test_missing.py").write_text(
        "import pytest\n\n"
        "def test_needs_it():\n    pytest.importorskip('no_such_module_for_ci_skips')\n\n"
        "def test_not_for_here():\n    pytest.skip('not relevant here')\n"
    )
    (tmp_path / "test_module_level.py").write_text(
        "import pytest\n\npytest.importorskip('no_such_module_either')\n\ndef test_a():\n    pass\n"
    )
    ci = run(tmp_path, "true")
    assert ci.returncode != 0
    assert "skipped for a missing dependency under CI" in ci.stdout
    assert "no_such_module_either" in ci.stdout  # a module-level skip, at collection
    alone = run(tmp_path / "test_missing.py", "true")
    assert "1 failed, 1 skipped" in alone.stdout, alone.stdout  # a plain skip stays a skip
    local = run(tmp_path, None)
    assert local.returncode == 0 and "3 skipped" in local.stdout, local.stdout
