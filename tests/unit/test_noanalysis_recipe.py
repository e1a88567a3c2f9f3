"""The no-analysis recipe continues the shipped planner in the flow's layout.

research/default-planner/learn_tools_noanalysis.yaml.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("trl")

ROOT = Path(__file__).parents[2]  # the recipes name their files from the repo root
RECIPES = ROOT / "research" / "default-planner"


def test_it_is_the_warm_recipe_without_the_analysis_on_train_lines_nothing_read() -> None:
    from flowlearn.training.config import parse_config

    warm = vars(parse_config(["--config", str(RECIPES / "learn_tools_warm.yaml")]))
    late = vars(parse_config(["--config", str(RECIPES / "learn_tools_noanalysis.yaml")]))
    changed = {key for key in warm if warm[key] != late[key]} - {"distributed_state"}
    assert changed == {"query_analysis", "data", "corpus", "learning_rate", "output_dir"}
    assert (warm["query_analysis"], late["query_analysis"]) == (True, False)
    root = Path(__file__).parents[2]  # a recipe's files are relative to the recipe
    corpus = Path(late["corpus"]).resolve().relative_to(root)
    assert str(corpus) == "evals/data/tooluse/corpus.jsonl"  # the task's own
    recipe = (RECIPES / "learn_tools_noanalysis.yaml").read_text()
    # its data: train.jsonl after the lines run 12 (16) and the probe (--skip 24, 40) read
    data = Path(late["data"]).resolve().relative_to(root)
    assert f"tail -n +65 evals/data/tooluse/train.jsonl > {data}" in recipe
    lines = (ROOT / "evals" / "data" / "tooluse" / "train.jsonl").read_text().splitlines()
    late_lines = lines[64:]
    kinds = [line.count('"kind": "lookup"') for line in late_lines]
    assert len(late_lines) >= late["max_steps"]  # 2 questions and 2 updates a round
    assert all(kinds[i] + kinds[i + 1] == 1 for i in range(0, len(kinds), 2))  # one of each
