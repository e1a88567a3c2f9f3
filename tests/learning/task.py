"""A synthetic tool-choice task for the learning test: arithmetic needs `python`, capitals need
`local_search`. The fixed engine is scripted and deterministic; only the planner learns.

A rollout may take two turns: the scripted verifier says CONTINUE while the last tool result
lacks what the question needs (python prints 'unknown' for a capital, a search finds no sum),
and the generator answers from the last tool result only. So the right tool first answers in
one turn, the wrong tool first can still be repaired in the second turn, and the wrong tool
twice (or a format error) gives a wrong answer. `turn_cost` charges the second turn, so that
the right tool first is the only best policy.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.runtime import get_runtime

from fakes import FakeChatModel
from flowlearn.evals.cases import Case
from flowlearn.training.rollouts import RewardTerm
from flowlearn.training.trajectories import Trajectory

CAPITALS = {
    "France": "Paris",
    "Spain": "Madrid",
    "Italy": "Rome",
    "Germany": "Berlin",
    "Japan": "Tokyo",
    "Egypt": "Cairo",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Norway": "Oslo",
    "Greece": "Athens",
    "Poland": "Warsaw",
    "Austria": "Vienna",
    "Sweden": "Stockholm",
    "Canada": "Ottawa",
    "Turkey": "Ankara",
}
"""Training capitals (15 countries)."""
HELD_OUT_CAPITALS = {
    "Kenya": "Nairobi",
    "Cuba": "Havana",
    "Ireland": "Dublin",
    "Portugal": "Lisbon",
    "Hungary": "Budapest",
    "Australia": "Canberra",
    "Indonesia": "Jakarta",
    "Philippines": "Manila",
    "Bangladesh": "Dhaka",
    "Ukraine": "Kyiv",
    "Romania": "Bucharest",
    "Bulgaria": "Sofia",
    "Serbia": "Belgrade",
    "Croatia": "Zagreb",
    "Iceland": "Reykjavik",
    "Latvia": "Riga",
    "Senegal": "Dakar",
    "Uganda": "Kampala",
    "Qatar": "Doha",
    "Ecuador": "Quito",
}
"""Held out: 20 countries in the corpus and in no training question; each held-out set asks
for every one of them once."""
MORE_CAPITALS = {
    "Brazil": "Brasilia",
    "China": "Beijing",
    "Russia": "Moscow",
    "Finland": "Helsinki",
    "Denmark": "Copenhagen",
    "Belgium": "Brussels",
    "Thailand": "Bangkok",
    "Iran": "Tehran",
    "Colombia": "Bogota",
    "Venezuela": "Caracas",
    "Nigeria": "Abuja",
    "Ghana": "Accra",
    "Morocco": "Rabat",
    "Vietnam": "Hanoi",
    "Nepal": "Kathmandu",
}
"""More training countries, for a test that asks more of held-out generalisation
(`write_corpus(more=True)`); not in `TRAIN_COUNTRIES`."""
HELD_OUT_COUNTRIES = list(HELD_OUT_CAPITALS)
TRAIN_COUNTRIES = list(CAPITALS)
ALL_CAPITALS = {**CAPITALS, **HELD_OUT_CAPITALS, **MORE_CAPITALS}
TRAIN_NUMBERS = (2, 59)
"""Training sums add numbers from 2 to 59 (totals up to 118)."""
HELD_OUT_NUMBERS = (60, 99)
"""Held-out sums add numbers from 60 to 99 (totals from 120): no number or total of training."""


def write_corpus(path: Path, *, first: Sequence[str] = (), more: bool = False) -> Path:
    """One passage per country, held-out ones included; the countries `first` come first.

    Tied passages rank in corpus order, so the first ones fill every search's later places.
    Every held-out country has its passage; `more`: `MORE_CAPITALS`' countries too.
    """
    capitals = {**CAPITALS, **HELD_OUT_CAPITALS, **(MORE_CAPITALS if more else {})}
    order = [*first, *(country for country in capitals if country not in first)]
    lines = [
        json.dumps(
            {"id": f"c{i}", "title": name, "text": f"{capitals[name]} is the capital of {name}."}
        )
        for i, name in enumerate(order)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_cases(
    n: int,
    seed: int,
    *,
    shuffle: bool = True,
    countries: list[str] = TRAIN_COUNTRIES,
    numbers: tuple[int, int] = TRAIN_NUMBERS,
) -> list[Case]:
    """Half arithmetic, half capital questions: shuffled, or alternating when not `shuffle`."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        if i % 2 == 0:
            a, b = rng.randint(*numbers), rng.randint(*numbers)
            cases.append(Case(f"{seed}-{i}", f"What is {a} + {b}?", str(a + b)))
        else:
            country = rng.choice(countries)
            capital = ALL_CAPITALS[country]
            cases.append(Case(f"{seed}-{i}", f"What is the capital of {country}?", capital))
    if shuffle:
        rng.shuffle(cases)
    return cases


def held_out_cases(seed: int = 1) -> list[Case]:
    """40 questions no training question asks, 20 distinct of each kind, shuffled: every
    held-out country's capital once, and 20 sums with different totals, of numbers from
    `HELD_OUT_NUMBERS` (no number or total of training)."""
    rng = random.Random(seed)
    sums: dict[int, tuple[int, int]] = {}  # by total: no two questions share an answer
    while len(sums) < len(HELD_OUT_COUNTRIES):
        a, b = rng.randint(*HELD_OUT_NUMBERS), rng.randint(*HELD_OUT_NUMBERS)
        sums.setdefault(a + b, (a, b))
    cases = [
        Case(f"held-{i}", f"What is {a} + {b}?", str(a + b))
        for i, (a, b) in enumerate(sums.values())
    ]
    cases += [
        Case(f"held-{len(sums) + i}", f"What is the capital of {country}?", capital)
        for i, (country, capital) in enumerate(HELD_OUT_CAPITALS.items())
    ]
    rng.shuffle(cases)
    return cases


def turn_cost(weight: float = 0.25) -> RewardTerm:
    """A reward term of `-weight` per planner turn after the first.

    With the outcome alone, "one tool first, the other if it fails" earns as much as the right
    tool first (a CI run learned it: reward 1.0, every first tool `local_search`).
    """

    def cost(trajectory: Trajectory) -> float:
        turns = sum(t["node"] == "planner" for t in trajectory.transitions)
        return -weight * max(turns - 1, 0)

    return cost


def turn_discount(weight: float = 0.25) -> RewardTerm:
    """A reward term that takes `weight` off a success per planner turn after the first.

    A success in two turns earns 0.75, a failure 0 however many turns it took. With
    `turn_cost` a failed second turn earned -0.25, less than stopping on a wrong result (0):
    while the planner's second tool was right in fewer than one try in four, a verifier earned
    more by stopping on every result.
    """

    def discount(trajectory: Trajectory) -> float:
        turns = sum(t["node"] == "planner" for t in trajectory.transitions)
        return -weight * max(turns - 1, 0) * trajectory.reward

    return discount


def _steps(prompt: str) -> list[str]:
    """The memory's actions and format errors (not verifications), in order."""
    memory = prompt.split("Memory of previous steps:", 1)[-1]
    blocks = re.split(r"\n(?=Step \d+)", memory)
    return [b for b in blocks if b.lstrip().startswith("Step ") and "verification:" not in b]


def _last_step(prompt: str) -> str:
    """The memory's last action or format error (not a verification), or ''."""
    steps = _steps(prompt)
    return steps[-1] if steps else ""


FAILED_RESULTS = ("unknown", "No passage matches the query.")
"""What a call that finds nothing returns (python's, the search's): a wrong tool's with
`search_sums`, or a failed call's with `fail_share`."""


def _last_found(prompt: str) -> str:
    """The memory's last step whose result is not a failed tool's, else its last step."""
    steps = _steps(prompt)
    found = [s for s in steps if _result(s).strip() not in FAILED_RESULTS]
    return found[-1] if found else (steps[-1] if steps else "")


def _result(step: str) -> str:
    return step.split("Result:", 1)[1] if "Result:" in step else ""


def has_needed(question: str, result: str) -> bool:
    """Whether a tool result holds what the question needs: its sum, or its country's capital."""
    sums = re.findall(r"(\d+) \+ (\d+)", question)
    if sums:
        total = int(sums[0][0]) + int(sums[0][1])
        return re.search(rf"\b{total}\b", result) is not None
    country = re.search(r"capital of (\w+)", question)
    return country is not None and f"is the capital of {country.group(1)}" in result


def _uniform(rng: random.Random, prompt: str) -> float:
    """One tool call's uniform draw. In a seeded rollout, a hash of the rollout's seed (each
    rollout of a group has its own) and the call's prompt (each turn its own draw): a rerun
    draws alike whatever order the rollout threads reach the engine in. Unseeded, from `rng`,
    one stream for all calls. A hash of the prompt alone was tried: a group's rollouts, asking
    alike, then all failed together, and the verifier learned nothing from them."""
    try:
        seed = getattr(get_runtime().context, "seed", None)
    except RuntimeError:  # called outside a graph
        seed = None
    if seed is None:
        return rng.random()
    digest = hashlib.blake2b(repr((seed, prompt)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def scripted_engine(
    *, search_sums: bool = False, skip_failed: bool = False, fail_share: float = 0.0, seed: int = 0
) -> FakeChatModel:
    """Fill tool arguments from the question; continue while the last tool result lacks what
    the question needs; answer from the last tool result.

    With `search_sums`, a search for a sum question is for its expression alone ("56 + 26"),
    which no passage matches: the result says so, as python's 'unknown' does for a capital,
    instead of listing capitals. With `skip_failed`, the answer comes from the memory's last
    result that found something (`FAILED_RESULTS`), as a generator reading the whole memory
    would. With `fail_share`, that share of tool calls find nothing, as calls to a flaky
    service would: python prints 'unknown', a search is for 'unknown'. Which ones is drawn
    from the rollout's seed and the call (`_uniform`), else from `seed`.
    """
    rng = random.Random(seed)

    def respond(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        prompt = str(messages[-1].content)
        question = re.search(r"Question: (.*)", prompt)
        text = question.group(1) if question else ""
        if tools:
            name = tools[0]["name"]
            sums = re.findall(r"(\d+) \+ (\d+)", text)
            failed = fail_share and _uniform(rng, prompt) < fail_share  # a call finding nothing
            if failed:
                args = {"code": "print('unknown')"} if name == "python" else {"query": "unknown"}
            elif name == "python":
                code = f"print({sums[0][0]} + {sums[0][1]})" if sums else "print('unknown')"
                args = {"code": code}
            elif sums and search_sums:
                args = {"query": f"{sums[0][0]} + {sums[0][1]}"}
            else:
                args = {"query": text}
            return AIMessage("", tool_calls=[{"name": name, "args": args, "id": "1"}])
        if prompt.startswith("Judge whether"):
            found = has_needed(text, _result(_last_step(prompt)))
            return "Conclusion: STOP" if found else "Conclusion: CONTINUE"
        if prompt.startswith("Answer the question"):
            result = _result(_last_found(prompt) if skip_failed else _last_step(prompt))
            passage = re.search(r"\(id: c\d+\) \w+\s*\n\s*(\w+) is the capital of", result)
            lines = result.strip().splitlines()
            answer = passage.group(1) if passage else (lines[0].strip() if lines else "")
            return f"<answer>{answer}</answer>"
        return "Analysis: answer the question with one tool."

    return FakeChatModel(respond=respond)
