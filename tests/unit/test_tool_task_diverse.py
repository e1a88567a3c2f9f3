"""The diverse training split: files as written, new forms apart from the held-out set, findable."""

from __future__ import annotations

import json
import re
from pathlib import Path

from flowlearn.evals import tool_task, tool_task_diverse
from flowlearn.nodes.tools.local_search import load_index


def read(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_shipped_files_are_the_generators_output(tmp_path: Path) -> None:
    tool_task_diverse.write(tmp_path)
    for path in (
        tool_task_diverse.TRAIN_DIVERSE_FILE,
        tool_task_diverse.ANSWERED_FIRST_FILE,
        tool_task_diverse.CORPUS_DIVERSE_FILE,
    ):
        assert path.read_text(encoding="utf-8") == (tmp_path / path.name).read_text(), path


def test_rounds_alternate_new_forms_and_the_tasks_training_each_a_lookup_then_arithmetic() -> None:
    cases = read(tool_task_diverse.TRAIN_DIVERSE_FILE)
    assert [c["kind"] for c in cases[:4]] == ["lookup", "arithmetic"] * 2
    assert [c["id"].split("-")[0] for c in cases[:8]] == ["diverse"] * 2 + ["train"] * 2 + [
        "diverse"
    ] * 2 + ["train"] * 2
    task = read(tool_task.TRAIN_FILE)
    assert [c for c in cases if c["id"].startswith("train-")] == [
        case for pair in zip(task[1::2], task[0::2], strict=True) for case in pair
    ][: len(cases) // 2]


def test_answered_first_reorders_only_the_new_pairs_best_answered_relation_first() -> None:
    plain = read(tool_task_diverse.TRAIN_DIVERSE_FILE)
    ordered = read(tool_task_diverse.ANSWERED_FIRST_FILE)
    assert sorted(ordered, key=str) == sorted(plain, key=str)  # the same cases
    for n in range(0, len(plain), 4):  # every round: a new pair, then the task's same pair
        assert ordered[n + 2 : n + 4] == plain[n + 2 : n + 4]
        assert [c["kind"] for c in ordered[n : n + 2]] == ["lookup", "arithmetic"]
        assert ordered[n]["id"].split("-")[-1] == ordered[n + 1]["id"].split("-")[-1]  # paired
    relations = [int(c["id"].split("-")[-1]) % 8 for c in ordered[0::4]]
    assert relations[:8] == list(tool_task_diverse.ANSWERED_FIRST) == relations[8:16]


def test_no_new_question_form_or_name_is_the_held_out_sets() -> None:
    cases = [c for c in read(tool_task_diverse.TRAIN_DIVERSE_FILE) if c["id"].startswith("div")]
    heldout = read(tool_task.HELDOUT_FILE)

    def form(question: str) -> str:  # the question with its numbers and names blanked
        return re.sub(r"\d+", "N", re.sub(r"\b[A-Z][a-z]+[a-z]\b", "X", question))

    assert not {form(c["question"]) for c in cases} & {form(c["question"]) for c in heldout}
    titles = {p["title"] for p in read(tool_task.CORPUS_FILE)}
    new = read(tool_task_diverse.CORPUS_DIVERSE_FILE)[len(titles) :]
    assert len(new) == 24 and not {p["title"] for p in new} & titles


def test_answers_are_right_and_every_lookup_finds_its_passage_first() -> None:
    index = load_index(str(tool_task_diverse.CORPUS_DIVERSE_FILE))
    for case in read(tool_task_diverse.TRAIN_DIVERSE_FILE):
        if case["kind"] == "lookup":
            passage, _ = index.search(case["question"], 1)[0]
            assert tool_task.first_answer(case) in passage.text, (case, passage)
        elif case["id"].startswith("diverse"):
            a, b = (int(n) for n in re.findall(r"\d+", case["question"]))
            text = case["question"]
            if re.search(r"times|multiplied|boxes", text):
                expected = a * b
            elif "difference" in text:
                expected = a - b
            elif "take" in text:  # "take B from A"
                expected = b - a
            else:
                expected = a + b
            assert case["answer"] == str(expected) and expected > 0, case


def test_its_recipe_is_the_shipped_planners_with_only_the_data_changed() -> None:
    from flowlearn.training.config import parse_config

    root = Path(__file__).parents[2]  # the recipes name their files relative to themselves
    shipped = vars(parse_config(["--config", str(root / "examples" / "learn_tools.yaml")]))
    diverse = vars(
        parse_config(["--config", str(root / "research/default-planner/learn_tools_diverse.yaml")])
    )
    changed = {key for key in shipped if shipped[key] != diverse[key]}
    assert changed - {"distributed_state"} == {"data", "corpus", "output_dir"}, changed
    for key, path in (("data", tool_task_diverse.TRAIN_DIVERSE_FILE),
                      ("corpus", tool_task_diverse.CORPUS_DIVERSE_FILE)):  # fmt: skip
        assert (root / diverse[key]).read_text() == path.read_text(), key


def test_the_warm_recipe_continues_the_shipped_planner_on_the_answered_first_split() -> None:
    from flowlearn.training.config import parse_config

    root = Path(__file__).parents[2]
    shipped = vars(parse_config(["--config", str(root / "examples" / "learn_tools.yaml")]))
    warm = vars(
        parse_config(["--config", str(root / "research/default-planner/learn_tools_warm.yaml")])
    )
    changed = {key for key in shipped if shipped[key] != warm[key]} - {"distributed_state"}
    assert changed == {"planner", "engine", "data", "corpus", "max_steps", "output_dir"}
    assert (warm["planner"], warm["engine"]) == ("default", "default-base")
    assert (root / warm["data"]).read_text() == tool_task_diverse.ANSWERED_FIRST_FILE.read_text()
