"""The tool-use task: questions a 135M model can answer only by picking the right tool.

Two kinds, half each, every question needing a tool:

- arithmetic on 3- to 5-digit numbers (products, sums, differences), which a small model cannot
  do in its head: the `python` tool computes it;
- lookups of invented facts (capitals of invented countries, founding years of invented
  institutes, authors of invented novels, ...) that no model can know: `local_search` finds them
  in the task's own corpus.

Phrasings vary per kind, so a planner must learn which kind a question is, not one template. The
shipped files are this module's output (`python -m flowlearn.evals.tool_task` rewrites them; a
test checks they match): `train.jsonl` and `heldout.jsonl` (cases: `id`, `question`, `answer`
(a string, or a list of acceptable answers, see `ALSO_RIGHT`),
`kind`, `tool`) and `corpus.jsonl` (one passage per fact, train and held-out alike), under
`evals/data/tooluse/`. Held-out questions use numbers and entities training never saw.

`heldout.jsonl` was read while the shipped planner and the `smollm2` preset were tuned, so it is
a development split now. `test.jsonl` (48 cases, drawn after the others from the same generator,
with entities and numbers no other split holds) is the held-out split: written once, read only to
report (`bench/learning.py`), never while tuning; its passages are appended to a copy of the
corpus, `test_corpus.jsonl`. `TEST_SHA256` records its bytes, and a test keeps them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

TASK_DIR = Path(__file__).resolve().parent / "data" / "tooluse"
TRAIN_FILE = TASK_DIR / "train.jsonl"
HELDOUT_FILE = TASK_DIR / "heldout.jsonl"
CORPUS_FILE = TASK_DIR / "corpus.jsonl"
TEST_FILE = TASK_DIR / "test.jsonl"
TEST_CORPUS_FILE = TASK_DIR / "test_corpus.jsonl"
TEST_SHA256 = "c564800241964ca3ac5945992be0e7dcdc4d1f1782d6cdd1e56b9b2d79650bbb"
"""The SHA-256 of `test.jsonl` as written on 2026-12-07, before any model was run on it."""
TRAIN_MIX_FILE = TASK_DIR / "train_lookup_heavy.jsonl"
"""The training cases in the CPU recipe's order: two lookups, then one arithmetic question, the
arithmetic left over at the end. The untrained planner already answers arithmetic with python
(20 of 24 held-out right), and with one lookup per arithmetic question its training rounds
drifted onto python for every question (`research/default-planner/`)."""

ARITHMETIC = [
    ("{a} * {b}", "What is {a} * {b}?"),
    ("{a} * {b}", "Compute {a} times {b}."),
    ("{a} * {b}", "What is the product of {a} and {b}?"),
    ("{a} * {b}", "Multiply {a} by {b}. What is the result?"),
    ("{a} + {b} + {c}", "What is {a} + {b} + {c}?"),
    ("{a} + {b} + {c}", "Add {a}, {b} and {c}. What is the total?"),
    ("{a} - {b}", "What is {a} - {b}?"),
    ("{a} * {b} - {c}", "Calculate {a} * {b} - {c}."),
]
"""(expression, question) templates; numbers come from `_numbers`."""

# (relation, passage template, question templates, answer kind)
FACTS = [
    ("capital", "{answer} is the capital of {entity}.",
     ["What is the capital of {entity}?", "Which city is the capital of {entity}?"], "place"),
    ("founded", "The {entity} was founded in {answer}.",
     ["In what year was the {entity} founded?", "When was the {entity} founded?"], "year"),
    ("author", "{entity} is a novel written by {answer}.",
     ["Who wrote the novel {entity}?", "Who is the author of {entity}?"], "person"),
    ("inventor", "The {entity} was invented by {answer}.",
     ["Who invented the {entity}?", "Which inventor created the {entity}?"], "person"),
    ("river", "The {entity} River flows into the {answer} Sea.",
     ["Into which sea does the {entity} River flow?"], "place"),
    ("height", "Mount {entity} is {answer} metres high.",
     ["How high is Mount {entity}, in metres?", "What is the height of Mount {entity} in metres?"],
     "height"),
]  # fmt: skip
ALSO_RIGHT = {"river": "{answer} Sea"}
"""A second acceptable answer per relation, where the passage's own words give one: asked "Into
which sea does the Kila River flow?", "the Gaboupol Sea" is as right as "Gaboupol". The embedded
SmolLM2 generator, shown the river's passage, wrote "<name> Sea" for 9 of the 12 river lookups
of train and held-out, all scored wrong before. A lookup's
`answer` is then a list, its first item the bare name (`first_answer`)."""

ENTITY_FORMS = {
    "capital": "{name}ia",
    "founded": "{name} Institute",
    "author": "The {name} Chronicles",
    "inventor": "{name} engine",
    "river": "{name}",
    "height": "{name}",
}

_ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "tr", "qu"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ou"]
_CODAS = ["", "n", "r", "l", "s", "th", "x"]


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def first_answer(case: dict[str, Any]) -> str:
    """Return the case's answer, or the first of its acceptable answers."""
    answer = case["answer"]
    return str(answer[0] if isinstance(answer, list) else answer)


def _answer(kind: str, rng: random.Random) -> str:
    if kind == "year":
        return str(rng.randint(1400, 1990))
    if kind == "height":
        return str(rng.randint(1200, 8400))
    if kind == "person":
        return f"{_word(rng, 2)} {_word(rng, 2)}"
    return _word(rng, 3)


def _numbers(expression: str, rng: random.Random) -> dict[str, int]:
    if "*" in expression:
        return {"a": rng.randint(101, 999), "b": rng.randint(11, 999), "c": rng.randint(10, 999)}
    a, b = rng.randint(1000, 99999), rng.randint(1000, 9999)
    return {"a": a, "b": b, "c": rng.randint(100, 9999)}


def arithmetic_cases(count: int, rng: random.Random, prefix: str) -> list[dict[str, Any]]:
    """Return `count` arithmetic cases, cycling through the templates."""
    cases = []
    for i in range(count):
        expression, question = ARITHMETIC[i % len(ARITHMETIC)]
        numbers = _numbers(expression, rng)
        value = eval(expression.format(**numbers), {"__builtins__": {}})  # our own digits only
        cases.append(
            {
                "id": f"{prefix}-math-{i}",
                "question": question.format(**numbers),
                "answer": str(value),
                "kind": "arithmetic",
                "tool": "python",
            }
        )
    return cases


def lookup_cases(
    count: int, rng: random.Random, prefix: str, used: set[str]
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Return `count` lookup cases and their passages; entity names never repeat (`used`)."""
    cases, passages = [], []
    for i in range(count):
        relation, passage, questions, kind = FACTS[i % len(FACTS)]
        name = _word(rng, 2)
        while name in used:
            name = _word(rng, 2)
        used.add(name)
        entity = ENTITY_FORMS[relation].format(name=name)
        answer = _answer(kind, rng)
        passage_id = f"{prefix}-{relation}-{i}"
        text = passage.format(entity=entity, answer=answer)
        passages.append({"id": passage_id, "title": entity, "text": text})
        question = questions[(i // len(FACTS)) % len(questions)]
        cases.append(
            {
                "id": f"{prefix}-fact-{i}",
                "question": question.format(entity=entity),
                "answer": [answer, ALSO_RIGHT[relation].format(answer=answer)]
                if relation in ALSO_RIGHT
                else answer,
                "kind": "lookup",
                "tool": "local_search",
            }
        )
    return cases, passages


def build(
    seed: int = 18, train: int = 96, heldout: int = 48, test: int = 48
) -> dict[str, list[dict[str, Any]]]:
    """Build the task's files' records: train, held-out (dev) and test cases and the corpora.

    Each split is half of each kind. Held-out numbers and names are drawn after training's, and
    the test split's after both, never repeating a name; the test split's passages go only to
    `test_corpus` (the corpus and them).
    """
    rng = random.Random(seed)
    used: set[str] = set()
    files: dict[str, list[dict[str, Any]]] = {"corpus": []}
    for split, size in (("train", train), ("heldout", heldout), ("test", test)):
        math = arithmetic_cases(size // 2, rng, split)
        facts, passages = lookup_cases(size - size // 2, rng, split, used)
        # interleave the kinds, so any prefix (`--limit`, a step's questions) holds both
        files[split] = [case for pair in zip(math, facts, strict=True) for case in pair]
        if split == "test":
            files["test_corpus"] = files["corpus"] + passages
        else:
            files["corpus"].extend(passages)
    files["train_lookup_heavy"] = lookup_heavy(files["train"])
    return files


def lookup_heavy(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Return `cases` in rounds of two lookups and one arithmetic question, leftovers last."""
    lookups = [c for c in cases if c["kind"] == "lookup"]
    math = [c for c in cases if c["kind"] == "arithmetic"]
    rounds = min(len(lookups) // 2, len(math))
    ordered = [c for i in range(rounds) for c in (lookups[2 * i], lookups[2 * i + 1], math[i])]
    return ordered + lookups[2 * rounds :] + math[rounds:]


def write(folder: Path = TASK_DIR) -> None:
    """Write train.jsonl, heldout.jsonl and corpus.jsonl into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, records in build().items():
        text = "".join(json.dumps(record) + "\n" for record in records)
        (folder / f"{name}.jsonl").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    write()
