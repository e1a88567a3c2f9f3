"""Secrets: API keys in the environment never reach anything a run writes or prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

SECRETS = {
    "TAVILY_API_KEY": "tvly-FAKE-SECRET-7c1d2e",
    "OPENAI_API_KEY": "sk-FAKE-SECRET-93ab41",
    "HF_TOKEN": "hf_FAKE_SECRET_5e6f70",
    "ANTHROPIC_API_KEY": "sk-ant-FAKE-SECRET-0011",
}


def flowlearn(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **SECRETS, "FLOWLEARN_CACHE": str(cwd / "cache")}
    return subprocess.run(
        [sys.executable, "-m", "flowlearn", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_no_key_appears_in_any_file_or_output_of_a_run(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    cases = tmp_path / "cases.jsonl"
    cases.write_text(
        "\n".join(
            json.dumps({"id": f"q{i}", "question": f"What is {i} + 1?", "answer": str(i + 1)})
            for i in range(2)
        )
        + "\n"
    )
    model = ["--planner", str(tiny_model_dir), "--engine-max-new-tokens", "8"]
    small = ["--max-turns", "1", "--max-new-tokens", "8", *model]
    runs = [
        [
            "run",
            "What is 2 + 2?",
            *small,
            "--save",
            "out/run.jsonl",
            "--thread",
            "t1",
            "--checkpoints",
            "out/checkpoints.sqlite",
        ],
        [
            "collect",
            "--data",
            str(cases),
            "--group-size",
            "2",
            "--out",
            "out/rollouts.jsonl",
            "--scorer",
            "exact_match",
            *small,
        ],
        ["eval", "--data", str(cases), "--scorer", "exact_match", "--out", "out/eval", *small],
        [
            "train",
            "--data",
            str(cases),
            "--output-dir",
            "out/train",
            "--max-turns",
            "1",
            "--num_generations",
            "2",
            "--questions-per-step",
            "1",
            "--max_completion_length",
            "8",
            "--save-steps",
            "1",
            "--bf16",
            "false",
            "--use_cpu",
            "true",
            *model,
        ],
    ]
    printed = []
    for args in runs:
        done = flowlearn(args, tmp_path)
        assert done.returncode == 0, (args[0], done.stderr[-2000:])
        printed.append(done.stdout + done.stderr)

    written = [p for p in (tmp_path / "out").rglob("*") if p.is_file()]
    kinds = {p.suffix for p in written}
    assert {".jsonl", ".sqlite", ".json", ".md", ".png", ".safetensors"} <= kinds, kinds
    for secret in SECRETS.values():
        for path in written:
            assert secret.encode() not in path.read_bytes(), f"{secret} leaked into {path}"
        for text in printed:
            assert secret not in text
