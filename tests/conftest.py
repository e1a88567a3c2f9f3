from __future__ import annotations

import sys
from pathlib import Path

# The shared fakes live beside the tests, importable as `fakes` from every test folder.
sys.path.insert(0, str(Path(__file__).parent))

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~30k-parameter Qwen2 and its tokenizer, built and saved once per test session."""
    from tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


pytest_plugins = ["ci_skips"]  # under CI, a skip for a missing dependency fails
