from __future__ import annotations

import pytest

from flowlearn.nodes.parsing import (
    extract_answer,
    match_tool_name,
    parse_planner_output,
    parse_verdict,
    read_answer,
)

PLAIN = "Justification: j\nContext: c\nSub-Goal: add the numbers\nTool Name: python"


@pytest.mark.parametrize(
    "text",
    [
        PLAIN,
        "**Justification:** j\n**Context:** c\n**Sub-Goal:** add the numbers\n"
        "**Tool Name:** python",
        "```\nJustification: j\nContext: c\nSub-Goal: add the numbers\nTool Name: python\n```",
        '{"justification": "j", "context": "c", "sub_goal": "add the numbers",'
        ' "tool_name": "python"}',
        "justification: j\ncontext: c\nsub goal: add the numbers\ntool name: `python`",
        "## Sub_Goal: add the numbers\n## Tool_Name: python",
        "Sub-Goal: first idea\nTool Name: generalist\nOn reflection:\n" + PLAIN,
    ],
)
def test_planner_formats_parse(text: str) -> None:
    decision = parse_planner_output(text)
    assert decision.ok, decision.error
    assert decision.sub_goal == "add the numbers"
    assert decision.tool_name == "python"


def test_planner_last_match_wins_and_multiline_values() -> None:
    text = "Context: line one\nline two\nSub-Goal: g\nTool Name: a\nTool Name: b"
    decision = parse_planner_output(text)
    assert decision.context == "line one\nline two"
    assert decision.tool_name == "b"


@pytest.mark.parametrize("text", ["", "I think we should search.", "Tool Name:", "Sub-Goal: x"])
def test_planner_malformed_is_reported(text: str) -> None:
    decision = parse_planner_output(text)
    assert not decision.ok
    assert decision.error


def test_planner_missing_subgoal_is_reported() -> None:
    decision = parse_planner_output("Tool Name: python")
    assert decision.error is not None and "Sub-Goal" in decision.error


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("web search", "web_search"),
        ("Web_Search", "web_search"),
        ("WEB-SEARCH", "web_search"),
        ("web_search_tool", "web_search"),
        ("Python", "python"),
        ("nothing", None),
        ("", None),
    ],
)
def test_tool_name_matching(name: str, expected: str | None) -> None:
    assert match_tool_name(name, ["web_search", "python"]) == expected


@pytest.mark.parametrize(
    ("text", "verdict", "clear"),
    [
        ("Looks complete.\nConclusion: STOP", "STOP", True),
        ("**Conclusion:** `CONTINUE`", "CONTINUE", True),
        ("conclusion: stop", "STOP", True),
        ("Conclusion: CONTINUE\n...\nConclusion: STOP", "STOP", True),
        ("We must STOP here.", "CONTINUE", False),
        ("Maybe stop, maybe continue.", "CONTINUE", False),
        ("STOP or CONTINUE?", "CONTINUE", False),
        ("", "CONTINUE", False),
    ],
)
def test_verdict(text: str, verdict: str, clear: bool) -> None:
    assert parse_verdict(text) == (verdict, clear)


@pytest.mark.parametrize(
    ("text", "answer", "tagged"),
    [
        ("So <answer>391</answer>.", "391", True),
        ("<ANSWER> a </ANSWER> then <answer>b</answer>", "b", True),
        ("<answer>unclosed 7", "unclosed 7", True),
        ("just 391", "just 391", False),
    ],
)
def test_extract_answer(text: str, answer: str, tagged: bool) -> None:
    assert extract_answer(text) == (answer, tagged)


@pytest.mark.parametrize(
    ("text", "answer", "source"),
    [
        ("So <answer>391</answer>.", "391", "tags"),
        ("Quoted <answer>42 then <answer>391</answer>", "391", "tags"),
        ("It is <answer> Nairobi\n", "Nairobi", "open_tag"),
        ("It is <answer>  ", "It is", "last_line"),
        ("Kenya's capital.\nThe answer is: **Nairobi**.", "Nairobi", "answer_line"),
        ("The final answer is 391.\nHope this helps!", "391", "answer_line"),
        ("Answer: 391\nAnswer = 392", "392", "answer_line"),
        ("We computed it. The answer is 391.", "391", "answer_line"),
        ("The answer to this is 391", "The answer to this is 391", "last_line"),
        ("I answer questions.\n\n  Nairobi.  \n", "Nairobi", "last_line"),
        ("", "", "none"),
        ("  \n ", "", "none"),
    ],
)
def test_read_answer_falls_back_in_order(text: str, answer: str, source: str) -> None:
    read = read_answer(text)
    assert (read.answer, read.source) == (answer, source)
    assert read.fallback == (source != "tags")


def test_the_prefilled_label_is_added_only_when_the_policy_did_not_write_one() -> None:
    from flowlearn.nodes.planner import plan_complete, with_reply_prefix

    continued = " python\nJustification: j\nContext: c\nSub-Goal: add the numbers\n"
    assert with_reply_prefix(continued, "Tool Name:") == "Tool Name:" + continued
    assert parse_planner_output(with_reply_prefix(continued, "Tool Name:")).tool_name == "python"
    assert plan_complete(continued, "Tool Name:") and not plan_complete(
        continued.rstrip("\n"), "Tool Name:"
    )
    # A planner that writes its own labels, in AgentFlow's order, is taken as it is.
    for own in (PLAIN, "**Justification:** j\n**Tool Name:** python", '{"tool_name": "python"}'):
        assert with_reply_prefix(own, "Tool Name:") == own
    # Text that only mentions a label mid-line still gets the prefill.
    assert with_reply_prefix(" the Tool Name: python", "Tool Name:").startswith("Tool Name:")
