"""How alike two tool results read, so the generator's worked answer nearest in form comes last.

The embedded SmolLM2 engine answers in the form of the last worked answer it is shown: after an
answer that starts its passage ("Nairobi is the capital of Kenya.") it answers "Rowiia" from
"The national animal of Rowiia is the Pekai."; after python printing 408 it drops the sign of
-1266 (`bench/results/generator_examples.txt`). So the generator orders its examples by how
alike their tool result reads to the memory's (`generator.ordered_examples`), the nearest last:
a nearest-neighbour choice of demonstrations, as Liu et al. (2021, "What Makes Good In-Context
Examples for GPT-3?") choose them, with a word-shape skeleton instead of an embedding (no second
model to load, and under a millisecond).

A result's skeleton is its first passage's sentence (a `local_search` result) or its first line
(anything else), as tokens: numbers become `0` (their sign kept), capitalised words become `X`
(a sentence's opening article excepted), other words are lower-cased. Two skeletons' likeness
is difflib's ratio.
"""

from __future__ import annotations

import re
from difflib import SequenceMatcher

_PASSAGE_HEAD = re.compile(r"^\[\d+\] \(id: [^)]*\)[^\n]*(?:\n|$)")
"""A `local_search` passage's first line: its rank, id and title."""
_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|\w+|[^\w\s]")
_OPENERS = {"the", "a", "an"}
"""Capitalised only because they open the sentence: kept as words."""


def skeleton(result: str) -> list[str]:
    """Return the word shape of `result`'s first passage sentence or first line."""
    text = result.strip()
    head = _PASSAGE_HEAD.match(text)
    if head is not None:
        text = text[head.end() :]
    line = text.split("\n", 1)[0]
    shape = []
    for index, token in enumerate(_TOKEN.findall(line)):
        if token[0].isdigit():
            shape.append("0")
        elif token[0].isupper() and not (index == 0 and token.lower() in _OPENERS):
            shape.append("X")
        else:
            shape.append(token.lower())
    return shape


def likeness(result: str, other: str) -> float:
    """Return how alike two tool results read, from 0 (nothing shared, or one empty) to 1."""
    shape, other_shape = skeleton(result), skeleton(other)
    if not shape or not other_shape:
        return 0.0
    return SequenceMatcher(None, shape, other_shape, autojunk=False).ratio()
