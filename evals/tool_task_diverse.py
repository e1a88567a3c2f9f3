"""Training questions in more relations and phrasings than the tool-use task's held-out set.

A planner trained on the task's six relations and eight arithmetic phrasings alone, tested on
seven other relations and four other phrasings (sampled at T=0.7, with the query analysis),
sent 8 of 21 lookups to python ("What is the official language of Taidaia?") and 3 of 21
arithmetic questions to local_search ("Add 29140 to 715."): first tool right 66.7% against the
untrained planner's 50.0% (`research/default-planner/`). Its choice followed the phrasings it
was trained on, not what a question needs. This split trains on eight relations
and eight phrasings that appear in no evaluation set (the task's held-out set, the outside set,
the dev set), alternating with the task's own, so a planner trained on it can be tested on all
three.

Files (`python -m flowlearn.evals.tool_task_diverse` rewrites them; a test checks they match):
`train_diverse.jsonl`, a lookup then an arithmetic question, the new relations and phrasings
on even rounds and the task's training questions on odd ones; `corpus_diverse.jsonl`, the
task's corpus plus the new passages (a recipe trains with it as `corpus`; the held-out set keeps
`corpus.jsonl`, so its measurements stay comparable); `train_diverse_answered_first.jsonl`, the
same rounds with the new relations in the order the untrained engine answers them
(`ANSWERED_FIRST`), so a run's first lookups are ones a search can be rewarded for.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from flowlearn.evals import tool_task
from flowlearn.evals.arithmetic import evaluate, parse_expression

TRAIN_DIVERSE_FILE = tool_task.TASK_DIR / "train_diverse.jsonl"
CORPUS_DIVERSE_FILE = tool_task.TASK_DIR / "corpus_diverse.jsonl"
ANSWERED_FIRST_FILE = tool_task.TASK_DIR / "train_diverse_answered_first.jsonl"

ARITHMETIC = [
    ("{a} * {b}", "Work out {a} times {b}."),
    ("{a} + {b}", "What do {a} and {b} make together?"),
    ("{a} - {b}", "What is the difference between {a} and {b}?"),
    ("{a} * {b}", "If each of {b} boxes holds {a} items, how many items are there?"),
    ("{a} + {b}", "Sum {a} and {b}."),
    ("{a} - {b}", "How much is left if you take {b} from {a}?"),
    ("{a} * {b}", "What is {a} multiplied by {b}?"),
    ("{a} + {b}", "What is the total of {a} and {b}?"),
]
"""(expression, question): phrasings in none of the evaluation sets."""

# (passage, question, entity form, answer kind: `tool_task._answer`'s)
FACTS = [
    ("The main export of {entity} is {answer}.", "What is the main export of {entity}?",
     "{name}ia", "place"),
    ("The {entity} Stadium holds {answer} people.",
     "How many people does the {entity} Stadium hold?", "{name}", "height"),
    ("The {entity} Theorem was proved by {answer}.", "Who proved the {entity} Theorem?",
     "{name}", "person"),
    ("The {entity} Festival is held in {answer}.", "Where is the {entity} Festival held?",
     "{name}", "place"),
    ("The {entity} Dam was built in {answer}.", "When was the {entity} Dam built?", "{name}",
     "year"),
    ("The leader of the {entity} Party is {answer}.", "Who leads the {entity} Party?", "{name}",
     "person"),
    ("The {entity} Bridge crosses the {answer} River.",
     "Which river does the {entity} Bridge cross?", "{name}", "place"),
    ("The anthem of {entity} is called {answer}.", "What is the anthem of {entity} called?",
     "{name}ia", "place"),
]  # fmt: skip

ANSWERED_FIRST = (1, 2, 3, 4, 6, 5, 0, 7)
"""`FACTS` by how often the untrained embedded generator answers them given their passage:
stadium, theorem, festival, dam, bridge 3 of 3, party leader 2 of 3, main export and anthem 2
of 6 (their answers are invented words it garbles). A training run that opened with a main
export never rewarded a lookup group in 8 rounds; this order starts with the answerable ones."""


def used_names() -> set[str]:
    """Every entity name of the task's corpus, so the new ones never repeat them."""
    lines = tool_task.CORPUS_FILE.read_text(encoding="utf-8").splitlines()
    return {word for line in lines for word in json.loads(line)["title"].split()}


def new_cases(
    count: int, seed: int = 21, used: set[str] | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Return `count` pairs (a lookup, an arithmetic question) in the new forms, and passages.

    Entity names avoid `used` (default: the task corpus's), which is updated with the new ones.
    """
    rng = random.Random(seed)
    used = used_names() if used is None else used
    cases, passages = [], []
    for i in range(count):
        passage, question, form, kind = FACTS[i % len(FACTS)]
        name = tool_task._word(rng, 2)
        while name in used:
            name = tool_task._word(rng, 2)
        used.add(name)
        entity, answer = form.format(name=name), tool_task._answer(kind, rng)
        passages.append({"id": f"diverse-{i}", "title": entity,
                         "text": passage.format(entity=entity, answer=answer)})  # fmt: skip
        cases.append({"id": f"diverse-fact-{i}", "question": question.format(entity=entity),
                      "answer": answer, "kind": "lookup", "tool": "local_search"})  # fmt: skip
        expression, asked = ARITHMETIC[i % len(ARITHMETIC)]
        numbers = tool_task._numbers(expression, rng)
        if "-" in expression and numbers["a"] < numbers["b"]:  # a difference, not a debt
            numbers["a"], numbers["b"] = numbers["b"], numbers["a"]
        value = evaluate(parse_expression(expression.format(**numbers)))  # integers: exact
        cases.append({"id": f"diverse-math-{i}", "question": asked.format(**numbers),
                      "answer": str(value), "kind": "arithmetic", "tool": "python"})  # fmt: skip
    return cases, passages


def rounds(
    new: list[dict[str, Any]], order: list[int], task_pairs: list[tuple[Any, Any]]
) -> list[dict[str, Any]]:
    """Return the new pairs in `order`, each followed by the task's next training pair."""
    ordered: list[dict[str, Any]] = []
    for n, i in enumerate(order):
        ordered += new[2 * i : 2 * i + 2]
        ordered += task_pairs[n] if n < len(task_pairs) else []
    return ordered


def build(pairs: int = 24) -> dict[str, list[dict[str, Any]]]:
    """Return the files' records: rounds alternating new forms and the task's training."""
    new, passages = new_cases(pairs)
    task = [json.loads(line) for line in tool_task.TRAIN_FILE.read_text().splitlines()]
    task_pairs = [(f, m) for m, f in zip(task[0::2], task[1::2], strict=True)]  # lookup first
    cycle = len(FACTS)  # within each cycle of the relations, the best answered first
    answered = sorted(range(pairs), key=lambda i: (i // cycle, ANSWERED_FIRST.index(i % cycle)))
    corpus = [json.loads(line) for line in tool_task.CORPUS_FILE.read_text().splitlines()]
    return {
        "train_diverse": rounds(new, list(range(pairs)), task_pairs),
        "train_diverse_answered_first": rounds(new, answered, task_pairs),
        "corpus_diverse": corpus + passages,
    }


def write(folder: Path = tool_task.TASK_DIR) -> None:
    """Write the training splits and corpus_diverse.jsonl into `folder`."""
    for name, records in build().items():
        text = "".join(json.dumps(record) + "\n" for record in records)
        (folder / f"{name}.jsonl").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    write()
