"""Scorers: pure functions shared by evals and training rewards, and the one table of them.

Every scorer returns a `Score` with `value` in [0, 1] and a human-readable `reason`, and never
raises on any prediction text: a malformed prediction scores 0 with the reason why. `SCORERS`
maps each rule-based scorer's name to its `(answer, case) -> Score` form; `flowlearn eval`,
`flowlearn collect`, training and `score_case` all look names up there.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from flowlearn.evals.arithmetic import ExpressionError, evaluate, numbers_used, parse_expression
from flowlearn.evals.cases import Case, _literal
from flowlearn.secrets import error_text

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel


@dataclass(frozen=True)
class Score:
    """A scorer's verdict: `value` in [0, 1] and the reason for it."""

    value: float
    reason: str

    def __post_init__(self) -> None:
        if not 0.0 <= self.value <= 1.0:
            raise ValueError(f"score value must be in [0, 1], got {self.value}")


_PUNCTUATION = frozenset(string.punctuation)
_NUMBER_MARK = re.compile(r"(?<![\w.])-(?=\d)|(?<=\d)\.(?=\d)")
"""A number's sign (`-1266`) and decimal point (`3.5`), which normalisation keeps."""


def normalize_answer(text: str) -> str:
    """SQuAD/HotpotQA normalisation: lower-case, drop punctuation, articles and extra spaces.

    One departure: a number keeps its minus sign and decimal point. SQuAD's rule drops them, so
    "1266" matched a reference of "-1266" and "35" one of "3.5" (the tool task's differences go
    negative: the embedded engine's unsigned answers scored right).
    Thousands separators and a sentence's closing period still go ("1,000." is "1000").
    """
    text = str(text).lower()
    kept = {m.start() for m in _NUMBER_MARK.finditer(text)}
    text = "".join(ch for i, ch in enumerate(text) if i in kept or ch not in _PUNCTUATION)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _as_list(references: str | Sequence[str]) -> list[str]:
    if isinstance(references, str):
        return [references]
    return [str(r) for r in references]


def exact_match(prediction: str, references: str | Sequence[str]) -> Score:
    """1 if the normalised prediction equals any normalised reference (acceptable answers)."""
    refs = _as_list(references)
    pred = normalize_answer(prediction)
    for ref in refs:
        if pred == normalize_answer(ref):
            return Score(1.0, f"matches {ref!r}")
    return Score(0.0, f"{prediction!r} matches none of {refs!r}")


def _f1(prediction: str, reference: str) -> float:
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    # HotpotQA's rule: yes/no/noanswer only match exactly.
    if (set(pred) | set(ref)) & {"yes", "no", "noanswer"} and pred != ref:
        return 0.0
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def token_f1(prediction: str, references: str | Sequence[str]) -> Score:
    """Best token-level F1 against any reference, after SQuAD normalisation."""
    refs = _as_list(references)
    best = max(((_f1(prediction, ref), ref) for ref in refs), default=(0.0, ""))
    return Score(best[0], f"F1 {best[0]:.2f} against {best[1]!r}")


def math_equal(prediction: str, reference: str | int | float) -> Score:
    r"""Mathematical equivalence through `math-verify` (fractions, LaTeX, \\boxed{}, integers)."""
    from math_verify import parse, verify

    try:
        gold = parse(_as_math(str(reference)))
        pred = parse(_as_math(str(prediction)))
        same = bool(gold and pred and verify(gold, pred))
    except Exception as exc:  # math-verify can raise on exotic LaTeX; that is a 0, not a crash
        return Score(0.0, f"could not compare: {type(exc).__name__}")
    if same:
        return Score(1.0, f"{prediction!r} equals {reference!r}")
    return Score(0.0, f"{prediction!r} differs from {reference!r}")


def _as_math(text: str) -> str:
    text = text.strip()
    if "$" in text or "\\boxed" in text or "\\(" in text:
        return text
    return f"${text}$"


def game24(expression: str, numbers: Sequence[int | float]) -> Score:
    """1 if `expression` uses exactly `numbers` once each with + - * / and equals 24.

    Any valid expression counts, not only the reference one. The text is parsed, never
    evaluated as Python.
    """
    try:
        tree = parse_expression(expression)
    except ExpressionError as exc:
        return Score(0.0, str(exc))
    used = numbers_used(tree)
    wanted = sorted(Fraction(n) for n in numbers)
    if used != wanted:
        return Score(0.0, f"uses {[_show(u) for u in used]}, must use {[_show(w) for w in wanted]}")
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        return Score(0.0, "divides by zero")
    if abs(float(value) - 24) < 1e-6:
        return Score(1.0, "uses each number once and equals 24")
    return Score(0.0, f"equals {_show(value)}, not 24")


def _show(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else str(float(value))


_LETTER = re.compile(r"^\(?([A-Za-z])[\).:]?(?:\s|$)")
_OPTION = re.compile(r"^\s*\(?([A-Za-z])[\).:]\s*(.*)$", re.DOTALL)


def _option_map(options: Sequence[str]) -> dict[str, str]:
    """Map letters to option texts, from "A. text" options or plain texts in order."""
    mapping = {}
    for index, option in enumerate(options):
        match = _OPTION.match(str(option))
        if match:
            mapping[match.group(1).upper()] = match.group(2).strip()
        else:
            mapping[string.ascii_uppercase[index]] = str(option).strip()
    return mapping


def multiple_choice(prediction: str, reference: str, options: Sequence[str]) -> Score:
    """1 if the prediction picks the reference option, by letter ("C", "(C)", "C. ...") or text.

    The reference may itself be a letter or an option's text; both are mapped both ways.
    """
    mapping = _option_map(options)
    by_text = {normalize_answer(text): letter for letter, text in mapping.items()}
    ref = str(reference).strip()
    ref_letter = (
        ref.upper()
        if ref.upper() in mapping and len(ref) == 1
        else by_text.get(normalize_answer(ref))
    )
    if ref_letter is None:
        return Score(0.0, f"reference {reference!r} is none of the options")
    pred = str(prediction).strip()
    letter_match = _LETTER.match(pred)
    if letter_match and letter_match.group(1).upper() in mapping:
        chosen = letter_match.group(1).upper()
    else:
        chosen = by_text.get(normalize_answer(_OPTION.sub(r"\2", pred)))
    if chosen is None:
        return Score(0.0, f"{prediction!r} names no option")
    if chosen == ref_letter:
        return Score(1.0, f"chose {chosen} ({mapping[chosen]})")
    return Score(0.0, f"chose {chosen}, answer is {ref_letter} ({mapping[ref_letter]})")


JUDGE_PROMPT = """\
You are grading an answer. Compare the response with the correct answer: is the response
equivalent to it (the same entity, number or choice, ignoring formatting and extra words)?

Question: {question}
Correct answer: {reference}
Response: {prediction}"""


def llm_judge(
    prediction: str, reference: str | Sequence[str], *, judge: BaseChatModel, question: str = ""
) -> Score:
    """Ask a chat model whether the prediction matches the reference (the paper's judge).

    Uses structured output (`analysis`, `true_false`); a judge failure scores 0 with the
    error (known secrets redacted) as the reason, so one bad call never stops an eval.
    """
    from pydantic import BaseModel, Field

    class Judgement(BaseModel):
        analysis: str = Field(description="Brief comparison of the response and the answer.")
        true_false: bool = Field(description="True if the response is correct.")

    refs = " | ".join(_as_list(reference))
    prompt = JUDGE_PROMPT.format(question=question, reference=refs, prediction=prediction)
    try:
        verdict: Any = judge.with_structured_output(Judgement).invoke(prompt)
    except Exception as exc:
        return Score(0.0, f"judge failed: {error_text(exc)}")  # a 401 may echo the judge's key
    if not isinstance(verdict, Judgement):
        return Score(0.0, "judge gave no verdict")
    return Score(1.0 if verdict.true_false else 0.0, verdict.analysis)


CaseScorer = Callable[[str, Case], Score]
"""`(answer, case) -> Score`: a scorer that reads what it needs from the case."""


def _references(case: Case) -> list[str]:
    reference = case.reference
    return [str(r) for r in reference] if isinstance(reference, list) else [str(reference)]


def _numbers(case: Case) -> list[int | float]:
    numbers = _literal(case.metadata.get("numbers", case.metadata.get("question")))
    if not isinstance(numbers, list):
        return []
    return [n for n in numbers if isinstance(n, int | float)]


SCORERS: dict[str, CaseScorer] = {
    "exact_match": lambda answer, case: exact_match(answer, _references(case)),
    "token_f1": lambda answer, case: token_f1(answer, _references(case)),
    "math_equal": lambda answer, case: math_equal(answer, case.reference),
    "game24": lambda answer, case: game24(answer, _numbers(case)),
    "multiple_choice": lambda answer, case: multiple_choice(
        answer, str(case.reference), case.metadata.get("options", [])
    ),
}
"""Every rule-based scorer by name; `--judge` swaps in `llm_judge` instead."""


def scorer_named(name: str) -> CaseScorer:
    """Return the scorer called `name`.

    Raises:
        KeyError: an unknown name, listing the known ones.

    """
    if name not in SCORERS:
        raise KeyError(f"unknown scorer {name!r}; known: {', '.join(sorted(SCORERS))}")
    return SCORERS[name]


def judge_scorer(judge: BaseChatModel) -> CaseScorer:
    """Return a scorer asking `judge` whether the answer matches the case's reference."""

    def score(answer: str, case: Case) -> Score:
        return llm_judge(answer, _references(case), judge=judge, question=case.query)

    return score
