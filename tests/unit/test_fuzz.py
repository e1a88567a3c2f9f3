"""Property tests: random and adversarial text never makes a parser or scorer raise."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from flowlearn.evals.scorers import (
    exact_match,
    game24,
    math_equal,
    multiple_choice,
    token_f1,
)
from flowlearn.nodes.parsing import (
    extract_answer,
    match_tool_name,
    parse_planner_output,
    parse_verdict,
)

# Text biased towards the syntax the parsers look for, so the fuzzing reaches their branches.
FRAGMENTS = st.sampled_from(
    [
        "Justification:",
        "Context:",
        "Sub-Goal:",
        "Tool Name:",
        "**",
        "`",
        "```",
        "```json",
        "{",
        "}",
        '"tool_name":',
        '"sub_goal":',
        "\n",
        " ",
        "python",
        "web search",
        "STOP",
        "CONTINUE",
        "Conclusion:",
        "<answer>",
        "</answer>",
        "(",
        ")",
        "×",
        "÷",
        "/",
        "*",
        "+",
        "-",
        "24",
        "8",
        "\\boxed{",
        "\\frac{1}{2}",
        "$",
        "A.",
        "(B)",
        "__import__('os')",
        "\x00",
        "é",
        "💥",
    ]
)
TEXT = st.one_of(st.text(max_size=300), st.lists(FRAGMENTS, max_size=40).map("".join))


@settings(max_examples=1500, deadline=None)
@given(TEXT)
def test_planner_parser_always_returns_a_decision(text: str) -> None:
    decision = parse_planner_output(text)
    assert decision.ok == (decision.error is None)
    if decision.ok:
        assert decision.tool_name and decision.sub_goal


@settings(max_examples=1500, deadline=None)
@given(TEXT)
def test_verdict_and_answer_extraction_never_raise(text: str) -> None:
    verdict, clear = parse_verdict(text)
    assert verdict in {"STOP", "CONTINUE"} and isinstance(clear, bool)
    answer, tagged = extract_answer(text)
    assert isinstance(answer, str) and isinstance(tagged, bool)


@settings(max_examples=1000, deadline=None)
@given(TEXT, st.lists(st.text(max_size=20), max_size=5))
def test_tool_matching_returns_an_available_name_or_none(name: str, tools: list[str]) -> None:
    match = match_tool_name(name, tools)
    assert match is None or match in tools


@settings(max_examples=1500, deadline=None)
@given(TEXT, st.lists(st.integers(-20, 30), min_size=4, max_size=4))
def test_game24_scores_in_range(expression: str, numbers: list[int]) -> None:
    score = game24(expression, numbers)
    assert score.value in {0.0, 1.0} and score.reason


@settings(max_examples=1000, deadline=None)
@given(TEXT, st.lists(st.text(max_size=30), min_size=1, max_size=3), st.lists(TEXT, max_size=5))
def test_text_scorers_score_in_range(prediction: str, refs: list[str], options: list[str]) -> None:
    for score in (
        exact_match(prediction, refs),
        token_f1(prediction, refs),
        multiple_choice(prediction, refs[0], options),
    ):
        assert 0.0 <= score.value <= 1.0 and score.reason


@settings(max_examples=150, deadline=None)
@given(TEXT, st.one_of(st.integers(-100, 100).map(str), TEXT))
def test_math_equal_never_raises(prediction: str, reference: str) -> None:
    assert math_equal(prediction, reference).value in {0.0, 1.0}
