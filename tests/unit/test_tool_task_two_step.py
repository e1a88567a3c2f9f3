"""The two-step tool-use split: files as written, answers recomputed from the corpus, findable."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from flowlearn.evals import tool_task, tool_task_two_step
from flowlearn.evals.tasks import load_cases_and_scorer
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.tools.local_search import load_index

SPLITS = (tool_task_two_step.TRAIN_FILE, tool_task_two_step.HELDOUT_FILE)
TIMES = {"twice": 2, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
TIMES |= {"eight": 8, "nine": 9}
UNITS = {"centimetres": 100, "grams": 1000, "minutes": 60}


def read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def new_passages() -> list[dict[str, str]]:
    return read(tool_task_two_step.CORPUS_FILE)[len(read(tool_task.CORPUS_FILE)) :]


def named(question: str, passages: list[dict[str, str]]) -> list[dict[str, str]]:
    """The passages whose entity the question names, in the question's order."""
    by_name = {p["title"].split()[0]: p for p in passages}
    return [by_name[word] for word in re.findall(r"[A-Z][a-z]+", question) if word in by_name]


def expected(question: str, values: list[int]) -> int:
    """The answer, worked out from the question's words and the looked-up values."""
    if len(values) == 2:  # "A than B": A - B; "after the founding of B was A founded": A - B
        first, second = values
        return second - first if "after the founding" in question else first - second
    (value,) = values
    year = re.search(r"\b\d{4}\b", question)
    if year:
        after = re.search(r"after \d{4}", question)
        return value - int(year.group()) if after else int(year.group()) - value
    unit = re.search(r"\b(centimetres|grams|minutes)\b", question)
    if unit:
        return value * UNITS[unit.group()]
    return value * next(TIMES[w] for w in re.findall(r"[a-z]+", question) if w in TIMES)


def test_shipped_files_are_the_generators_output(tmp_path: Path) -> None:
    tool_task_two_step.write(tmp_path)
    for path in (*SPLITS, tool_task_two_step.CORPUS_FILE):
        assert path.read_text(encoding="utf-8") == (tmp_path / path.name).read_text(), path


def test_the_corpus_is_the_tasks_unchanged_then_one_passage_per_new_fact() -> None:
    corpus, task = read(tool_task_two_step.CORPUS_FILE), read(tool_task.CORPUS_FILE)
    assert corpus[: len(task)] == task
    new = new_passages()
    assert len(new) == 36 + 72  # a passage per lookup: one or two per question
    names = [p["title"].split()[0].lower() for p in new]
    assert len(set(names)) == len(names)
    old = {w.lower() for p in task for w in re.findall(r"\w+", p["title"] + " " + p["text"])}
    assert not set(names) & old


def test_splits_hold_both_kinds_alternating_with_their_steps() -> None:
    for path, size in zip(SPLITS, (48, 24), strict=True):
        cases = read(path)
        assert len(cases) == size and len({c["id"] for c in cases}) == size
        assert [c["kind"] for c in cases[:4]] == ["lookup_arithmetic", "two_lookups"] * 2
        forms = [c["form"] for c in cases]
        assert forms.count("difference") == size // 2
        assert forms.count("conversion") == forms.count("multiple") == size // 6
        assert forms.count("years_between") == size // 6
        for case in cases:
            lookups = 2 if case["kind"] == "two_lookups" else 1
            assert case["steps"] == ["local_search"] * lookups + ["python"], case
            assert case["tool"] == "local_search" and isinstance(case["answer"], str)


def test_every_answer_is_right_recomputed_from_the_passages_the_question_names() -> None:
    passages = new_passages()
    for case in read(SPLITS[0]) + read(SPLITS[1]):
        needed = named(case["question"], passages)
        assert len(needed) == case["steps"].count("local_search"), case
        values = [int(re.findall(r"\d+", p["text"])[0]) for p in needed]
        assert all(100 <= v <= 9999 for v in values), (case, values)
        answer = expected(case["question"], values)
        assert case["answer"] == str(answer) and answer >= 100, (case, values)


def test_held_out_entities_and_numbers_are_not_trainings() -> None:
    passages = new_passages()
    seen = {}
    for path in SPLITS:
        needed = [p for c in read(path) for p in named(c["question"], passages)]
        seen[path.name] = (
            {p["title"].split()[0] for p in needed},
            {int(re.findall(r"\d+", p["text"])[0]) for p in needed},
            {c["answer"] for c in read(path)},
        )
    train, heldout = seen["two_step_train.jsonl"], seen["two_step_heldout.jsonl"]
    for train_part, heldout_part in zip(train, heldout, strict=True):
        assert not train_part & heldout_part
    assert len(train[0]) + len(heldout[0]) == len(passages)  # every new passage is used


def test_every_needed_passage_is_in_the_top_k_for_a_query_naming_its_entity() -> None:
    index = load_index(str(tool_task_two_step.CORPUS_FILE))
    k = SMOLLM2_PROMPTS.search_k  # the smollm2 preset's 3 (the default is 5)
    for case in read(SPLITS[0]) + read(SPLITS[1]):
        for passage in named(case["question"], new_passages()):
            subject = re.match(r"(.+?) (is|weighs|was|lasted) ", passage["text"])
            assert subject is not None, passage
            for query in (subject.group(1), passage["title"], case["question"]):
                found = [p.id for p, _ in index.search(query, k)]
                assert passage["id"] in found, (query, passage)


def test_the_tasks_own_lookups_still_find_their_passage_first_in_the_shared_corpus() -> None:
    index = load_index(str(tool_task_two_step.CORPUS_FILE))
    for case in read(tool_task.TRAIN_FILE) + read(tool_task.HELDOUT_FILE):
        if case["kind"] == "lookup":
            passage, _ = index.search(case["question"], 1)[0]
            assert tool_task.first_answer(case) in passage.text, (case, passage)


def test_the_split_loads_with_the_shared_scorer_and_takes_separators() -> None:
    cases, scorer = load_cases_and_scorer(data=SPLITS[1], scorer="exact_match")
    assert len(cases) == 24 and cases[0].metadata["steps"] == ["local_search", "python"]
    case = next(c for c in cases if len(c.reference) >= 5)
    answer = str(case.reference)
    separated = f"{int(answer):,}"
    for text in (answer, f"{answer}.", separated, f"{separated}."):
        assert scorer(text, case).value == 1.0, text
    assert scorer(str(int(answer) + 1), case).value == 0.0
