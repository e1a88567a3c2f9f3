"""Write a tool-use question set unlike the shipped task, with its own corpus, as issue 18's check.

Issue 18 is checked on a held-out set kept outside the repository ("questions that need python or
local_search, with its own corpus passed by --corpus"), run through `flowlearn eval` at its
defaults. This set stands in for it: phrasings and relations the shipped task
(`evals/tool_task.py`) never uses ("Subtract ... from ...", "Who painted ...?", "What is the
currency of ...?"), invented names from another seed, and a corpus of its own. Usage:

    python research/default-planner/outside_set.py --out runs/outside
    python research/default-planner/outside_set.py --relations dev --seed 7 --out runs/dev  # a set
    to tune on
    flowlearn eval --data runs/outside/cases.jsonl --corpus runs/outside/corpus.jsonl \\
        --scorer exact_match --planner default --out runs/eval-outside-default
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from flowlearn.evals.arithmetic import evaluate, parse_expression

ARITHMETIC = [
    ("{a} + {b}", "What is {a} plus {b}?"),
    ("{a} * {b}", "How much is {a} multiplied by {b}?"),
    ("{a} - {b}", "Subtract {b} from {a}."),
    ("{a} + {b}", "Find the sum of {a} and {b}."),
    ("{a} * {b}", "What do you get if you multiply {a} by {b}?"),
    ("{a} - {b}", "What is {a} minus {b}?"),
]
# (passage, question, entity form, answer kind)
FACTS = [
    ("{answer} is the mayor of {entity}.", "Who is the mayor of {entity}?", "{name}ville",
     "person"),
    ("{entity} was painted by {answer}.", "Who painted {entity}?", "The {name} Portrait", "person"),
    ("The currency of {entity} is the {answer}.", "What is the currency of {entity}?",
     "{name}ia", "word"),
    ("Lake {entity} is {answer} metres deep.", "How deep is Lake {entity}, in metres?", "{name}",
     "number"),
    ("The {entity} Symphony was composed by {answer}.", "Who composed the {entity} Symphony?",
     "{name}", "person"),
    ("The {entity} comet was discovered in {answer}.",
     "In which year was the {entity} comet discovered?", "{name}", "year"),
]  # fmt: skip
# A third set of relations and phrasings, to choose prompts on (`--relations dev`), so that the
# outside set stays a test: answers first, in the middle and last in their passage.
DEV_ARITHMETIC = [
    ("{b} - {a}", "What is {b} minus {a}?"),  # negative: a > b
    ("{a} + {b}", "Add {a} to {b}."),
    ("{a} * {b}", "What is the product of {a} and {b}?"),
    ("{b} - {a}", "How much is {b} take away {a}?"),
]
DEV_FACTS = [
    ("The official language of {entity} is {answer}.",
     "What is the official language of {entity}?", "{name}ia", "word"),
    ("The {entity} Company was founded by {answer}.", "Who founded the {entity} Company?",
     "{name}", "person"),
    ("The {entity} Tower is {answer} metres tall.", "How tall is the {entity} Tower, in metres?",
     "{name}", "number"),
    ("{answer} is the largest city in {entity}.", "What is the largest city in {entity}?",
     "{name}ia", "word"),
    ("The {entity} Treaty was signed in {answer}.", "In what year was the {entity} Treaty signed?",
     "{name}", "year"),
    ("The national animal of {entity} is the {answer}.",
     "What is the national animal of {entity}?", "{name}ia", "word"),
    ("{entity} is a film directed by {answer}.", "Who directed the film {entity}?",
     "The {name} Road", "person"),
]  # fmt: skip
RELATIONS = {"outside": (ARITHMETIC, FACTS), "dev": (DEV_ARITHMETIC, DEV_FACTS)}


# Another alphabet than `evals/tool_task.py`'s (h, w; ai, eo): with seed 2026 no name of the
# set's corpus appears in the task's.
ONSETS = ["b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "eo"]


def _word(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(syllables)).capitalize()


def _answer(kind: str, rng: random.Random) -> str:
    if kind == "person":
        return f"{_word(rng, 2)} {_word(rng, 3)}"
    if kind == "year":
        return str(rng.randint(1500, 2000))
    if kind == "number":
        return str(rng.randint(40, 900))
    return _word(rng, 2)


def build(
    seed: int = 2026, per_kind: int = 12, relations: str = "outside"
) -> tuple[list[dict[str, Any]], list[dict]]:
    """Return the cases (arithmetic and lookups interleaved) and the lookups' corpus."""
    arithmetic, facts = RELATIONS[relations]
    rng = random.Random(seed)
    cases, corpus, used = [], [], set()
    for i in range(per_kind):
        expression, question = arithmetic[i % len(arithmetic)]
        numbers = {"a": rng.randint(1000, 99999), "b": rng.randint(101, 9999)}
        if "*" in expression:
            numbers = {"a": rng.randint(101, 999), "b": rng.randint(11, 999)}
        value = evaluate(parse_expression(expression.format(**numbers)))  # integers: exact
        cases.append({"id": f"{relations}-math-{i}", "question": question.format(**numbers),
                      "answer": str(value), "kind": "arithmetic", "tool": "python"})  # fmt: skip
        passage, question, form, kind = facts[i % len(facts)]
        name = _word(rng, 2)
        while name in used:
            name = _word(rng, 2)
        used.add(name)
        entity, answer = form.format(name=name), _answer(kind, rng)
        corpus.append({"id": f"{relations}-{i}", "title": entity,
                       "text": passage.format(entity=entity, answer=answer)})  # fmt: skip
        cases.append({"id": f"{relations}-fact-{i}", "question": question.format(entity=entity),
                      "answer": answer, "kind": "lookup", "tool": "local_search"})  # fmt: skip
    return cases, corpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/outside"))
    parser.add_argument("--per-kind", type=int, default=12)
    parser.add_argument("--relations", choices=sorted(RELATIONS), default="outside")
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    cases, corpus = build(args.seed, args.per_kind, args.relations)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, records in (("cases", cases), ("corpus", corpus)):
        text = "".join(json.dumps(record) + "\n" for record in records)
        (args.out / f"{name}.jsonl").write_text(text, encoding="utf-8")
    print(f"{len(cases)} cases and {len(corpus)} passages in {args.out}")


if __name__ == "__main__":
    main()
