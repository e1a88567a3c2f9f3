"""Two-step tool-use questions: a lookup then arithmetic, or two lookups then their difference.

Every question of the tool-use task (`flowlearn.evals.tool_task`) is answered by one tool call,
so a verifier that says STOP after the first tool result is never wrong there, and one that has
learnt to say CONTINUE cannot be told apart from it. Each question here needs a second step:

- `lookup_arithmetic`: one invented number to look up, then arithmetic on it, in three forms
  (`form`), a third each: a unit conversion with an integer result (metres to centimetres,
  kilograms to grams, hours to minutes), a multiple ("twice the height of Mount X", "four
  bridges as long as the X Bridge"), and the years between an institute's founding and a year
  the question names;
- `two_lookups`: two invented numbers of one kind to look up, then their difference ("How many
  metres higher is Mount A than Mount B?").

Half of each split is of each kind, alternating, so any prefix (`--limit`) holds both. Every
looked-up number has 3 or 4 digits and every answer at least 3, beyond a 135M model's head
arithmetic; answers are integers written as strings. Each case keeps the task's fields (`id`,
`question`, `answer`, `kind`, `tool`: the first tool, as the task's files name it) and adds
`form` and `steps`, the tools in order: one search per fact, then python. (A search with a
two-lookup question's own words finds both its passages among the top three, so a planner may
also get there with one search; the arithmetic still needs a step after it.)

Files (`python -m flowlearn.evals.tool_task_two_step` rewrites them; a test checks they match):
`two_step_train.jsonl`, `two_step_heldout.jsonl` (entities and numbers training never saw) and
`two_step_corpus.jsonl`: the task's corpus, unchanged and in its order, then one passage per
new fact, in the task's passage style, so one corpus serves the one-step and the two-step
questions. The task's own files and `corpus.jsonl` are left as they are.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flowlearn.evals import tool_task, tool_task_diverse

TRAIN_FILE = tool_task.TASK_DIR / "two_step_train.jsonl"
HELDOUT_FILE = tool_task.TASK_DIR / "two_step_heldout.jsonl"
CORPUS_FILE = tool_task.TASK_DIR / "two_step_corpus.jsonl"

LOOKUP_THEN_MATH = ["local_search", "python"]
TWO_LOOKUPS = ["local_search", "local_search", "python"]


@dataclass(frozen=True)
class Measure:
    """A number invented entities have, its passage and the questions that use it."""

    passage: str
    """The fact, in the task's passage style: "Mount {name} is {value} metres high."."""
    title: str
    """The passage's title: the entity as the task's corpus names it."""
    low: int
    high: int
    """The range values are drawn from, inclusive."""
    difference: str
    """The two-lookup question; the entity `{a}` has the larger value."""
    conversion: str = ""
    """Asks for the value in a smaller unit; "" when the measure has none."""
    factor: int = 1
    """The conversion's factor: the answer is the value times it."""
    multiple: str = ""
    """Asks for a multiple of the value (`{times}`: "twice", `{count}`: "two"); "" for none."""


MEASURES = {
    "height": Measure(
        "Mount {name} is {value} metres high.", "{name}", 1200, 8400,
        "How many metres higher is Mount {a} than Mount {b}?",
        "How high is Mount {name} in centimetres?", 100,
        "What is {times} the height of Mount {name}, in metres?",
    ),
    "length": Measure(
        "The {name} Bridge is {value} metres long.", "{name} Bridge", 1000, 9999,
        "How many metres longer is the {a} Bridge than the {b} Bridge?",
        "How long is the {name} Bridge in centimetres?", 100,
        "How long, in metres, are {count} bridges as long as the {name} Bridge, laid end to end?",
    ),
    "weight": Measure(
        "The {name} Bell weighs {value} kilograms.", "{name} Bell", 1000, 9999,
        "How many kilograms heavier is the {a} Bell than the {b} Bell?",
        "How much does the {name} Bell weigh in grams?", 1000,
        "How many kilograms do {count} bells as heavy as the {name} Bell weigh together?",
    ),
    "duration": Measure(
        "The {name} Expedition lasted {value} hours.", "{name} Expedition", 100, 999,
        "How many hours longer did the {a} Expedition last than the {b} Expedition?",
        "How many minutes did the {name} Expedition last?", 60,
        "How many hours would {count} expeditions as long as the {name} Expedition last in all?",
    ),
    "founded": Measure(
        "The {name} Institute was founded in {value}.", "{name} Institute", 1400, 1990,
        "How many years after the founding of the {b} Institute was the {a} Institute founded?",
    ),
}  # fmt: skip
"""The passages follow `tool_task.FACTS` (height and founding years are its own relations)."""

SCALED = ("height", "length", "weight", "duration")
"""The measures conversions and multiples cycle through."""

YEARS = [
    ("How many years passed between the founding of the {name} Institute and {year}?", True),
    ("How old was the {name} Institute in {year}, in years?", True),
    ("How many years after {year} was the {name} Institute founded?", False),
]
"""(question, whether the question's year comes after the founding) for `years_between`."""

FORMS = ("conversion", "multiple", "years_between")
"""The `lookup_arithmetic` forms, in the order they take turns."""

MULTIPLIERS = {
    2: ("twice", "two"),
    3: ("three times", "three"),
    4: ("four times", "four"),
    5: ("five times", "five"),
    6: ("six times", "six"),
    7: ("seven times", "seven"),
    8: ("eight times", "eight"),
    9: ("nine times", "nine"),
}
"""Multiplier -> (`{times}`, `{count}`) as the multiple questions write it."""

MIN_GAP = 100
"""Two looked-up values, or a value and the question's year, differ by at least this."""


def used_names() -> set[str]:
    """Return every word of the task's corpora, lower-cased, so new names never repeat one."""
    lines = tool_task_diverse.CORPUS_DIVERSE_FILE.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]  # the task's corpus and the diverse split's
    return {w.lower() for r in records for w in re.findall(r"\w+", r["title"] + " " + r["text"])}


@dataclass
class _Draw:
    """Random names and values for one split; names are recorded in `used` across splits."""

    rng: random.Random
    used: set[str]
    split: str
    passages: list[dict[str, str]]

    def fact(self, key: str, value: int | None = None) -> tuple[str, int]:
        """Invent an entity with `key`'s measure (`value`, else drawn); add its passage."""
        measure = MEASURES[key]
        name = tool_task._word(self.rng, 2)
        while name.lower() in self.used:
            name = tool_task._word(self.rng, 2)
        self.used.add(name.lower())
        value = self.rng.randint(measure.low, measure.high) if value is None else value
        self.passages.append(
            {
                "id": f"two-step-{self.split}-{key}-{len(self.passages)}",
                "title": measure.title.format(name=name),
                "text": measure.passage.format(name=name, value=value),
            }
        )
        return name, value


def _case(
    draw: _Draw, form: str, n: int, question: str, answer: int, steps: list[str]
) -> dict[str, Any]:
    return {
        "id": f"two-step-{draw.split}-{form}-{n}",
        "question": question,
        "answer": str(answer),
        "kind": "two_lookups" if form == "difference" else "lookup_arithmetic",
        "form": form,
        "tool": steps[0],
        "steps": steps,
    }


def _lookup_arithmetic_case(draw: _Draw, n: int) -> dict[str, Any]:
    """Return the `n`-th lookup-then-arithmetic case of a split, its form and measure by turn."""
    form, turn = FORMS[n % len(FORMS)], n // len(FORMS)
    if form == "years_between":
        template, later = YEARS[turn % len(YEARS)]
        founding = MEASURES["founded"]
        if later:  # a recent year, and a founding at least `MIN_GAP` years before it
            year = draw.rng.randint(2000, 2026)
            name, founded = draw.fact("founded", draw.rng.randint(founding.low, year - MIN_GAP))
        else:
            name, founded = draw.fact("founded")
            year = draw.rng.randint(1100, founded - MIN_GAP)
        answer = year - founded if later else founded - year
        return _case(draw, form, n, template.format(name=name, year=year), answer, LOOKUP_THEN_MATH)
    key = SCALED[turn % len(SCALED)]
    measure = MEASURES[key]
    name, value = draw.fact(key)
    if form == "conversion":
        question, answer = measure.conversion.format(name=name), value * measure.factor
    else:
        times = draw.rng.randint(2, 9)
        words = MULTIPLIERS[times]
        question = measure.multiple.format(name=name, times=words[0], count=words[1])
        answer = value * times
    return _case(draw, form, n, question, answer, LOOKUP_THEN_MATH)


def _two_lookups_case(draw: _Draw, n: int) -> dict[str, Any]:
    """Return the `n`-th two-lookup case of a split: a difference, the measure by turn."""
    key = tuple(MEASURES)[n % len(MEASURES)]
    measure = MEASURES[key]
    larger = draw.rng.randint(measure.low + MIN_GAP, measure.high)
    smaller = draw.rng.randint(measure.low, larger - MIN_GAP)
    if draw.rng.random() < 0.5:  # the larger's passage comes first or second by chance
        a, _ = draw.fact(key, larger)
        b, _ = draw.fact(key, smaller)
    else:
        b, _ = draw.fact(key, smaller)
        a, _ = draw.fact(key, larger)
    question = measure.difference.format(a=a, b=b)
    return _case(draw, "difference", n, question, larger - smaller, TWO_LOOKUPS)


def build(seed: int = 24, train: int = 48, heldout: int = 24) -> dict[str, list[dict[str, Any]]]:
    """Return the three files' records: the two splits' cases and the corpus.

    Each split is half of each kind, alternating; held-out names and numbers are drawn after
    training's, and no name repeats one of training's or of the task's corpora.
    """
    rng = random.Random(seed)
    used = used_names()
    corpus = [json.loads(line) for line in tool_task.CORPUS_FILE.read_text().splitlines()]
    files: dict[str, list[dict[str, Any]]] = {}
    for split, size in (("train", train), ("heldout", heldout)):
        draw = _Draw(rng, used, split, [])
        pairs = [
            (_lookup_arithmetic_case(draw, n), _two_lookups_case(draw, n)) for n in range(size // 2)
        ]
        files[f"two_step_{split}"] = [case for pair in pairs for case in pair]
        corpus.extend(draw.passages)
    files["two_step_corpus"] = corpus
    return files


def write(folder: Path = tool_task.TASK_DIR) -> None:
    """Write two_step_train.jsonl, two_step_heldout.jsonl and two_step_corpus.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, records in build().items():
        text = "".join(json.dumps(record) + "\n" for record in records)
        (folder / f"{name}.jsonl").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    write()
