from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "trl", "peft", "datasets", "langchain_community", "rank_bm25")


@pytest.mark.parametrize(
    "module", ["flowlearn", "flowlearn.engine", "flowlearn.graphs", "flowlearn.nodes"]
)
def test_import_does_not_pull_heavy_dependencies(module: str) -> None:
    code = f"import sys, {module}; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "", f"import {module} loaded {loaded}"
