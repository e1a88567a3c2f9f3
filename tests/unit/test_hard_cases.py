"""research/default-planner/hard_cases.py: the fresh pool and the rounds it keeps.

The probe needs SmolLM2.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from flowlearn.evals.tool_task import CORPUS_FILE

BENCH = Path(__file__).parents[2] / "research" / "default-planner"


def load() -> object:
    spec = importlib.util.spec_from_file_location("hard_cases", BENCH / "hard_cases.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pool_is_fresh_and_every_lookup_has_its_passage() -> None:
    hard = load()
    cases, passages = hard.pool(30, 8, 32, seed=23)  # run 16's pool drew names twice  # type: ignore[attr-defined]
    kinds = [c["kind"] for c in cases]
    assert kinds.count("arithmetic") == 8 + 32
    assert kinds.count("lookup") == 30 + 20  # diverse relations the engine garbles left out
    assert len({c["id"] for c in cases}) == len(cases)
    task = [json.loads(line)["title"] for line in CORPUS_FILE.read_text().splitlines()]
    titles = [p["title"] for p in passages]
    assert len(titles) == kinds.count("lookup") and not set(titles) & set(task)
    forms = {"The", "Chronicles", "Institute", "engine"}
    names = [w.removesuffix("ia") for t in titles for w in t.split() if w not in forms]
    assert len(set(names)) == len(names), "a name drawn twice (Mount X and the X Dam)"
    for case in cases:
        if case["kind"] == "lookup":
            passage = next(p for p in passages if p["title"] in case["question"])
            answer = case["answer"][0] if isinstance(case["answer"], list) else case["answer"]
            assert answer in passage["text"]


def test_rounds_pair_the_least_sure_lookup_and_arithmetic_question() -> None:
    hard = load()
    cases = [
        {"id": f"{kind}-{i}", "kind": kind} for kind in ("lookup", "arithmetic") for i in range(3)
    ]
    p = [0.9, 0.1, 0.5, 0.2, 0.8, 0.4]
    chosen = hard.hardest(cases, p, 2)  # type: ignore[attr-defined]
    assert [c["id"] for c in chosen] == ["lookup-1", "arithmetic-0", "lookup-2", "arithmetic-2"]


def test_eligible_keeps_the_task_lookups_and_drops_excluded_phrasings() -> None:
    hard = load()
    eligible = hard.eligible  # type: ignore[attr-defined]
    task = {"id": "hard-fact-1", "kind": "lookup", "question": "What is the capital of Xia?"}
    new = {"id": "hard-diverse-fact-1", "kind": "lookup", "question": "Who proved it?"}
    boxes = {"id": "hard-diverse-math-3", "kind": "arithmetic", "question": "If 9 boxes hold 2?"}
    assert eligible(task, "task", None) and not eligible(new, "task", None)
    assert eligible(new, "all", None)
    assert eligible(boxes, "task", None) and not eligible(boxes, "all", "boxes")


def test_its_recipe_is_the_warm_one_on_the_hard_rounds_at_a_lower_rate() -> None:
    from flowlearn.training.config import parse_config

    hard = vars(parse_config(["--config", str(BENCH / "learn_tools_hard.yaml")]))
    warm = vars(parse_config(["--config", str(BENCH / "learn_tools_warm.yaml")]))
    changed = {key for key in warm if warm[key] != hard[key]} - {"distributed_state"}
    assert changed == {"data", "corpus", "learning_rate", "output_dir"}
    root = Path(__file__).parents[2]  # a recipe's files are relative to the recipe
    data, corpus = (Path(hard[key]).resolve().relative_to(root) for key in ("data", "corpus"))
    assert str(data).startswith("runs/hard/") and str(corpus) == "runs/hard/corpus.jsonl"


def test_bad_options_say_so_and_leave_out_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hard = load()
    main = hard.main  # type: ignore[attr-defined]
    with pytest.raises(SystemExit, match=r"no .*probe\.jsonl; run without it first"):
        main(["--out", str(tmp_path), "--reuse-probe"])
    other = [{"id": "hard-math-0", "question": "What is 1 * 2?", "p_right": 0.5}]
    (tmp_path / "probe.jsonl").write_text(json.dumps(other[0]) + "\n")
    (tmp_path / "corpus.jsonl").write_text("kept\n")
    with pytest.raises(SystemExit, match="probed another pool"):
        main(["--out", str(tmp_path), "--reuse-probe"])
    assert (tmp_path / "corpus.jsonl").read_text() == "kept\n"  # nothing rewritten
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--exclude", "(boxes"])
    assert "--exclude '(boxes' is not a regular expression" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--per-kind", "0"])
    assert "must be at least 1" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "probe.jsonl"]
