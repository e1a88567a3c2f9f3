"""A synthetic tool-choice task for the learning test: arithmetic needs `python`, capitals need
`local_search`. The fixed engine is scripted and deterministic; only the planner learns."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage

from fakes import FakeChatModel
from flowlearn.evals.cases import Case

CAPITALS = {
    "France": "Paris",
    "Spain": "Madrid",
    "Italy": "Rome",
    "Germany": "Berlin",
    "Japan": "Tokyo",
    "Egypt": "Cairo",
    "Peru": "Lima",
    "Chile": "Santiago",
    "Kenya": "Nairobi",
    "Norway": "Oslo",
    "Greece": "Athens",
    "Cuba": "Havana",
    "Poland": "Warsaw",
    "Austria": "Vienna",
    "Ireland": "Dublin",
    "Portugal": "Lisbon",
}


def write_corpus(path: Path) -> Path:
    """One passage per country."""
    lines = [
        json.dumps(
            {"id": f"c{i}", "title": country, "text": f"{capital} is the capital of {country}."}
        )
        for i, (country, capital) in enumerate(CAPITALS.items())
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def make_cases(n: int, seed: int, *, shuffle: bool = True) -> list[Case]:
    """Half arithmetic, half capital questions: shuffled, or alternating when not `shuffle`."""
    rng = random.Random(seed)
    cases = []
    for i in range(n):
        if i % 2 == 0:
            a, b = rng.randint(2, 99), rng.randint(2, 99)
            cases.append(Case(f"{seed}-{i}", f"What is {a} + {b}?", str(a + b)))
        else:
            country = rng.choice(list(CAPITALS))
            cases.append(
                Case(f"{seed}-{i}", f"What is the capital of {country}?", CAPITALS[country])
            )
    if shuffle:
        rng.shuffle(cases)
    return cases


def scripted_engine() -> FakeChatModel:
    """Fill tool arguments from the question, always stop, answer from the last tool result."""

    def respond(messages: list[Any], tools: list[dict[str, Any]]) -> Any:
        prompt = str(messages[-1].content)
        question = re.search(r"Question: (.*)", prompt)
        text = question.group(1) if question else ""
        if tools:
            name = tools[0]["name"]
            sums = re.findall(r"(\d+) \+ (\d+)", text)
            if name == "python":
                code = f"print({sums[0][0]} + {sums[0][1]})" if sums else "print('unknown')"
                args = {"code": code}
            else:
                args = {"query": text}
            return AIMessage("", tool_calls=[{"name": name, "args": args, "id": "1"}])
        if prompt.startswith("Judge whether"):
            return "Conclusion: STOP"
        if prompt.startswith("Answer the question"):
            results = re.findall(r"Result: (.*)", prompt)
            last = results[-1] if results else ""
            passage = re.search(r"\(id: c\d+\) \w+\s*\n\s*(\w+) is the capital of", prompt)
            answer = passage.group(1) if passage else last.strip()
            return f"<answer>{answer}</answer>"
        return "Analysis: answer the question with one tool."

    return FakeChatModel(respond=respond)
