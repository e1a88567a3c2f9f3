from __future__ import annotations

import pytest

from fakes import FakeChatModel
from flowlearn.evals.scorers import (
    Score,
    exact_match,
    game24,
    llm_judge,
    math_equal,
    multiple_choice,
    normalize_answer,
    token_f1,
)


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("The  Eiffel Tower!", "eiffel tower"),
        ("an apple, a pear", "apple pear"),
        ("  James   MADISON. ", "james madison"),
        ("-1266", "-1266"),
        ("It is -3.5.", "it is -3.5"),
        ("1,000.", "1000"),
        ("well-known 3-4", "wellknown 34"),
    ],
)
def test_normalisation(text: str, normal: str) -> None:
    assert normalize_answer(text) == normal


def test_exact_match_over_acceptable_answers() -> None:
    assert exact_match("the James Madison", ["james madison", "madison"]).value == 1.0
    assert exact_match("Madison", ["james madison", "madison"]).value == 1.0
    assert exact_match("Jefferson", "james madison").value == 0.0


@pytest.mark.parametrize(
    ("prediction", "reference", "value"),
    [
        ("1266", "-1266", 0.0),
        ("-1266", "-1266", 1.0),
        ("35", "3.5", 0.0),
        ("110880.", "110880", 1.0),
    ],
)
def test_exact_match_keeps_a_numbers_sign_and_decimal_point(
    prediction: str, reference: str, value: float
) -> None:
    assert exact_match(prediction, reference).value == value


def test_token_f1_partial_credit_and_yes_no() -> None:
    assert token_f1("James Madison Jr", "james madison").value == pytest.approx(0.8)
    assert token_f1("Madison", ["james madison", "madison"]).value == 1.0
    assert token_f1("yes indeed", "yes").value == 0.0
    assert token_f1("", "x").value == 0.0


@pytest.mark.parametrize(
    ("prediction", "reference", "value"),
    [
        ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
        ("1/2", "\\frac{1}{2}", 1.0),
        ("33", 33, 1.0),
        ("$33$", "33", 1.0),
        ("The answer is \\boxed{27}", "27", 1.0),
        ("34", 33, 0.0),
        ("\\frac{1}{3}", "0.33", 0.0),
        ("not a number", "5", 0.0),
    ],
)
def test_math_equal(prediction: str, reference: object, value: float) -> None:
    assert math_equal(prediction, reference).value == value  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("expression", "numbers", "value", "reason"),
    [
        ("(1+1+1)×8", [1, 1, 1, 8], 1.0, "equals 24"),
        ("8*(1+1+1)", [1, 1, 1, 8], 1.0, "equals 24"),  # differs from the reference
        ("(11+1)*(1+1)", [1, 1, 1, 11], 1.0, "equals 24"),
        ("8 ÷ (3 - 8 ÷ 3)", [3, 3, 8, 8], 1.0, "equals 24"),  # needs exact fractions
        ("(1+1+1)×8 = 24", [1, 1, 1, 8], 1.0, "equals 24"),
        ("3*8", [1, 1, 3, 8], 0.0, "must use"),  # numbers missing
        ("(1+1)*12", [1, 1, 1, 12], 0.0, "must use"),  # a number left out
        ("8*3*1*1", [1, 1, 1, 8], 0.0, "must use"),  # wrong numbers
        ("(8+8+8)*1*1", [1, 1, 1, 8], 0.0, "must use"),  # reused number
        ("4/(1-1)*6", [1, 1, 4, 6], 0.0, "divides by zero"),
        ("1+1+1+8", [1, 1, 1, 8], 0.0, "equals 11"),
        ("__import__('os').system('echo pwned')", [1, 2, 3, 4], 0.0, "not allowed"),
        ("2**3*3*1", [1, 2, 3, 3], 0.0, "not allowed"),
        ("", [1, 2, 3, 4], 0.0, "expected an expression"),
    ],
)
def test_game24(expression: str, numbers: list[int], value: float, reason: str) -> None:
    score = game24(expression, numbers)
    assert score.value == value and reason in score.reason


def test_game24_never_executes(tmp_path: object, capfd: pytest.CaptureFixture[str]) -> None:
    game24("__import__('os').system('echo pwned')", [1, 2, 3, 4])
    assert "pwned" not in capfd.readouterr().out


OPTIONS = ["A. Hemolytic uremic syndrome", "B. Oral ulcers", "C. Colorectal cancer"]


@pytest.mark.parametrize(
    ("prediction", "reference", "value"),
    [
        ("C", "Colorectal cancer", 1.0),
        ("(C)", "Colorectal cancer", 1.0),
        ("C. Colorectal cancer", "Colorectal cancer", 1.0),
        ("colorectal cancer", "C", 1.0),
        ("B", "Colorectal cancer", 0.0),
        ("Oral ulcers", "C", 0.0),
        ("something else", "C", 0.0),
    ],
)
def test_multiple_choice(prediction: str, reference: str, value: float) -> None:
    assert multiple_choice(prediction, reference, OPTIONS).value == value


def test_multiple_choice_plain_option_texts() -> None:
    assert multiple_choice("B", "cat", ["dog", "cat"]).value == 1.0


def test_llm_judge_structured_verdict_and_failure() -> None:
    from langchain_core.messages import AIMessage

    def respond(messages, tools):  # type: ignore[no-untyped-def]
        return AIMessage(
            content="",
            tool_calls=[
                {
                    "name": tools[0]["name"],
                    "id": "1",
                    "args": {"analysis": "same person", "true_false": True},
                }
            ],
        )

    assert llm_judge("Madison", "James Madison", judge=FakeChatModel(respond=respond)) == Score(
        1.0, "same person"
    )

    def broken(messages, tools):  # type: ignore[no-untyped-def]
        raise TimeoutError("judge timed out")

    failed = llm_judge("x", "y", judge=FakeChatModel(respond=broken))
    assert failed.value == 0.0 and "judge failed: TimeoutError" in failed.reason


def test_score_bounds() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Score(1.5, "too much")
