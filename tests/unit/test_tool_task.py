"""The shipped tool-use task: files as the generator writes them, splits apart, answers findable."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from flowlearn.evals import tool_task
from flowlearn.evals.tasks import load_cases_and_scorer
from flowlearn.nodes.tools.local_search import load_index


def read(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_shipped_files_are_the_generators_output(tmp_path: Path) -> None:
    tool_task.write(tmp_path)
    for name in ("train", "heldout", "test", "corpus", "test_corpus", "train_lookup_heavy"):
        shipped = (tool_task.TASK_DIR / f"{name}.jsonl").read_text(encoding="utf-8")
        assert shipped == (tmp_path / f"{name}.jsonl").read_text(encoding="utf-8"), name


def test_the_test_split_is_the_one_recorded_before_any_model_read_it() -> None:
    """Its hash is kept: a test split edited after results were reported is a new split."""
    data = tool_task.TEST_FILE.read_bytes()
    assert hashlib.sha256(data).hexdigest() == tool_task.TEST_SHA256


def test_splits_hold_both_kinds_alternating_and_never_share_a_question_or_entity() -> None:
    train, heldout = read(tool_task.TRAIN_FILE), read(tool_task.HELDOUT_FILE)
    test = read(tool_task.TEST_FILE)
    assert (len(train), len(heldout), len(test)) == (96, 48, 48)
    for cases in (train, heldout, test):
        kinds = [case["kind"] for case in cases]
        assert kinds[:4] == ["arithmetic", "lookup", "arithmetic", "lookup"]
        assert kinds.count("arithmetic") == kinds.count("lookup")
        assert {c["tool"] for c in cases if c["kind"] == "lookup"} == {"local_search"}
        assert {c["tool"] for c in cases if c["kind"] == "arithmetic"} == {"python"}
    questions = [{c["question"] for c in cases} for cases in (train, heldout, test)]
    assert sum(map(len, questions)) == len(set().union(*questions))  # no question twice
    words = re.compile(r"[A-Z][a-z]+")
    names = {
        split: {w for c in cases if c["kind"] == "lookup" for w in words.findall(c["question"])}
        for split, cases in (("train", train), ("heldout", heldout), ("test", test))
    }
    common = {"What", "Which", "Who", "When", "Into", "How", "In", "The", "Mount", "River"}
    common |= {"Institute", "Chronicles", "Name"}
    assert not (names["train"] & names["heldout"]) - common
    assert not (names["test"] & (names["train"] | names["heldout"])) - common
    entities = {w for c in test if c["kind"] == "lookup" for w in words.findall(c["question"])}
    assert len(entities - common) >= 20  # at least 20 distinct entities


def test_arithmetic_answers_are_right_and_need_more_than_a_digit_or_two() -> None:
    for case in (
        read(tool_task.TRAIN_FILE) + read(tool_task.HELDOUT_FILE) + read(tool_task.TEST_FILE)
    ):
        if case["kind"] != "arithmetic":
            continue
        numbers = [int(n) for n in re.findall(r"\d+", case["question"])]
        assert all(n >= 10 for n in numbers) and len(case["answer"]) >= 4, case
        text = case["question"]
        if "times" in text or "*" in text or "product" in text or "Multiply" in text:
            expected = numbers[0] * numbers[1] - (numbers[2] if len(numbers) > 2 else 0)
        elif "-" in text:
            expected = numbers[0] - numbers[1]
        else:
            expected = sum(numbers)
        assert case["answer"] == str(expected), case


def test_every_lookup_answer_is_in_the_passage_local_search_finds_first() -> None:
    index = load_index(str(tool_task.CORPUS_FILE))
    for case in read(tool_task.TRAIN_FILE) + read(tool_task.HELDOUT_FILE):
        if case["kind"] == "lookup":
            passage, _ = index.search(case["question"], 1)[0]
            assert tool_task.first_answer(case) in passage.text, (case, passage)
    index = load_index(str(tool_task.TEST_CORPUS_FILE))  # every split's passages
    for case in read(tool_task.TEST_FILE) + read(tool_task.HELDOUT_FILE):
        if case["kind"] == "lookup":
            passage, _ = index.search(case["question"], 1)[0]
            assert tool_task.first_answer(case) in passage.text, (case, passage)


def test_the_task_loads_with_the_shared_scorer() -> None:
    cases, scorer = load_cases_and_scorer(data=tool_task.HELDOUT_FILE, scorer="exact_match")
    assert len(cases) == 48 and cases[0].reference == read(tool_task.HELDOUT_FILE)[0]["answer"]
    assert scorer(f"{cases[0].reference}.", cases[0]).value == 1.0
    assert scorer("391", cases[0]).value == 0.0


def test_a_river_lookup_accepts_the_bare_name_and_the_sea() -> None:
    cases, scorer = load_cases_and_scorer(data=tool_task.HELDOUT_FILE, scorer="exact_match")
    river = next(c for c in cases if "River" in c.query)
    name = river.reference[0]
    assert river.reference == [name, f"{name} Sea"]
    for answer in (name, f"the {name} Sea", f"{name} Sea."):
        assert scorer(answer, river).value == 1.0, answer
    assert scorer(f"The {name} River", river).value == 0.0


def test_the_lookup_heavy_order_holds_the_training_cases_two_lookups_to_one() -> None:
    train, mix = read(tool_task.TRAIN_FILE), read(tool_task.TRAIN_MIX_FILE)
    assert sorted(c["id"] for c in mix) == sorted(c["id"] for c in train)
    assert [c["kind"] for c in mix[:6]] == ["lookup", "lookup", "arithmetic"] * 2
    assert [c["kind"] for c in mix[:72]].count("lookup") == 48
