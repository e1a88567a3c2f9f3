"""Tolerant parsers for model outputs: planner decisions, verdicts, answers, tool names.

Small models write markdown bold, code fences, JSON, odd casing and repeated fields. Every parser
here accepts all of those, never raises on any input, and reports what it could not find, so a
malformed output becomes a recorded format error instead of a crash.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

PLANNER_FIELDS = ("justification", "context", "sub_goal", "tool_name")

_FIELD_NAMES = {
    "justification": "justification",
    "context": "context",
    "sub goal": "sub_goal",
    "subgoal": "sub_goal",
    "tool name": "tool_name",
    "tool": "tool_name",
}
# A field label at the start of a line, in any markdown dressing: "**Sub-Goal:**", "## Tool Name:",
# "- sub_goal =", ...; the value runs until the next label.
_LABEL = re.compile(
    r"^[ \t>*_#`\-]*(justification|context|sub[\s_\-]*goal|tool[\s_\-]*name|tool)[ \t*_`]*[:=]"
    r"[ \t*_`]*",
    re.IGNORECASE | re.MULTILINE,
)
_FENCE = re.compile(r"```[a-zA-Z]*\n?|```")
_JSON_OBJECT = re.compile(r"\{.*?\}", re.DOTALL)


@dataclass(frozen=True)
class PlannerDecision:
    """The four fields of a planner turn, and what went wrong if anything did."""

    justification: str
    context: str
    sub_goal: str
    tool_name: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the output parsed and named a tool."""
        return self.error is None


def _field_key(label: str) -> str:
    words = re.sub(r"[\s_\-]+", " ", label.strip().lower())
    return _FIELD_NAMES.get(words, _FIELD_NAMES.get(words.replace(" ", ""), words))


def _clean(value: str) -> str:
    value = _FENCE.sub("", value)
    return value.strip().strip("*_`\"'").strip()


def _from_json(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in _JSON_OBJECT.finditer(text):
        try:
            data = json.loads(match.group(0))
        except ValueError:
            continue
        if not isinstance(data, dict):
            continue
        for key, value in data.items():
            field = _field_key(str(key))
            if field in PLANNER_FIELDS and isinstance(value, str | int | float):
                found[field] = str(value).strip()
    return found


def _from_labels(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    matches = list(_LABEL.finditer(text))
    for match, nxt in zip(matches, [*matches[1:], None], strict=False):
        end = nxt.start() if nxt else len(text)
        found[_field_key(match.group(1))] = _clean(text[match.end() : end])
    return found


def starts_with_label(text: str) -> bool:
    """Whether `text` opens with a planner field's label (any field, any markdown dressing)."""
    return _LABEL.match(text.lstrip()) is not None


def parse_planner_output(text: str) -> PlannerDecision:
    r"""Parse `Tool Name / Justification / Context / Sub-Goal` (any order) from a planner output.

    Labelled lines and JSON objects are both accepted; when a field appears more than once the
    last occurrence wins (models often restate their plan). Never raises.

    >>> parse_planner_output("**Sub-Goal:** add\n**Tool Name:** `python`").tool_name
    'python'
    """
    text = text if isinstance(text, str) else str(text)
    fields = {**_from_json(text), **_from_labels(_FENCE.sub("", text))}
    tool = fields.get("tool_name", "").splitlines()[0].strip() if fields.get("tool_name") else ""
    tool = tool.strip("*_`\"'[]().,;: ")
    error = None
    if not tool:
        error = "no `Tool Name:` line found in the planner output"
    elif not fields.get("sub_goal"):
        error = "no `Sub-Goal:` line found in the planner output"
    return PlannerDecision(
        justification=fields.get("justification", ""),
        context=fields.get("context", ""),
        sub_goal=fields.get("sub_goal", ""),
        tool_name=tool,
        error=error,
    )


def normalize_tool_name(name: str) -> str:
    """Fold case, spaces, dashes and underscores so `Web Search` matches `web_search`."""
    return re.sub(r"[\s_\-]+", "", name).lower()


def match_tool_name(name: str, available: Iterable[str]) -> str | None:
    """Return the available tool that `name` refers to, or None.

    Matching ignores case, spaces, dashes and underscores, and tolerates a trailing `_tool` /
    ` tool` suffix either way.
    """
    wanted = normalize_tool_name(name)
    if not wanted:
        return None
    names = list(available)
    for candidate in names:
        if normalize_tool_name(candidate) == wanted:
            return candidate
    stripped = wanted.removesuffix("tool")
    for candidate in names:
        if normalize_tool_name(candidate).removesuffix("tool") == stripped and stripped:
            return candidate
    return None


# The verdict is read only from the verifier's own `Conclusion:` line: a line that starts, after
# optional markdown, with the label. An indented or quoted (`>`) line is text the verifier copied
# (memory renders tool results indented), and a STOP elsewhere may be a tool's word, not its own.
_CONCLUSION_LINE = re.compile(
    r"^(?:[*_#`\-][ \t]*)*conclusion\b(.*)$", re.IGNORECASE | re.MULTILINE
)
_CONCLUSION_VALUE = re.compile(r"^[\s*_`#]*[:=]?[\s*_`\"']*(stop|continue)\b", re.IGNORECASE)


def parse_verdict(text: str) -> tuple[Literal["STOP", "CONTINUE"], bool]:
    """Return the verifier's verdict and whether it was stated clearly.

    Only the last line that starts with `Conclusion:` (markdown allowed) counts; STOP or CONTINUE
    anywhere else may be quoted from a tool. Anything unclear means CONTINUE.
    """
    text = text if isinstance(text, str) else str(text)
    lines = _CONCLUSION_LINE.findall(text)
    value = _CONCLUSION_VALUE.match(lines[-1]) if lines else None
    if value is None:
        return "CONTINUE", False
    return ("STOP" if value.group(1).upper() == "STOP" else "CONTINUE"), True


# A complete pair whose content holds no other opening tag: a fragment quoted from a tool
# ("<answer>42" with no closing tag) cannot swallow the generator's own `<answer>391</answer>`.
_ANSWER = re.compile(r"<answer>((?:(?!<answer>).)*?)</answer>", re.IGNORECASE | re.DOTALL)
_OPEN_ANSWER = re.compile(r"<answer>((?:(?!<answer>).)*)$", re.IGNORECASE | re.DOTALL)
_OPEN_TAG = re.compile(r"<answer>", re.IGNORECASE)
# "The answer is X", "The final answer is: X", "Answer: X", "**Answer** = X" as a line's last
# statement; X runs to the end of the line.
_ANSWER_LINE = re.compile(
    r"(?:^[\s*_#>`\-]*|[.!?]\s+|\b(?:the|my)\s+)(?:final\s+)?answer"
    r"(?:\s+is\b[\s*_`]*:?|[\s*_`]*[:=])\s*(\S.*)$",
    re.IGNORECASE | re.MULTILINE,
)

AnswerSource = Literal["tags", "open_tag", "answer_line", "last_line", "none"]


@dataclass(frozen=True)
class AnswerRead:
    """The answer read from a generator's reply, and where in the reply it was found."""

    answer: str
    source: AnswerSource
    """`tags`: the last complete `<answer>...</answer>` pair. The fallbacks, in order:
    `open_tag` (an opening tag and the text after it up to the end, as a budget cut leaves it),
    `answer_line` (the last "The answer is X" / "Answer: X" line, X trimmed), `last_line` (the
    last non-empty line, trimmed), `none` (an empty reply)."""

    @property
    def fallback(self) -> bool:
        """Whether the answer came from a fallback rather than a complete tag pair."""
        return self.source != "tags"


def _trim(value: str) -> str:
    """Trim a fallback's answer: whitespace, markdown dressing, quotes, a final full stop."""
    dressing = "*_`\"' \t"
    return value.strip(dressing).removesuffix(".").strip(dressing).removesuffix(".").strip()


def read_answer(text: str) -> AnswerRead:
    r"""Read the answer from a generator's reply: its tags, else the fallbacks of `AnswerRead`.

    Only the generator's own reply is ever passed here, never its prompt, so text quoted from
    a tool result cannot count; inside the reply, a fragment such as `<answer>42` before a
    complete pair does not count either.

    >>> read_answer("Kenya's capital.\nThe answer is: **Nairobi**.")
    AnswerRead(answer='Nairobi', source='answer_line')
    """
    text = text if isinstance(text, str) else str(text)
    tagged = _ANSWER.findall(text)
    if tagged:
        return AnswerRead(tagged[-1].strip(), "tags")
    opened = _OPEN_ANSWER.search(text)
    if opened and opened.group(1).strip():
        return AnswerRead(opened.group(1).strip(), "open_tag")
    lines = [line for line in _OPEN_TAG.sub("", text).splitlines() if line.strip()]
    for line in reversed(lines):
        stated = list(_ANSWER_LINE.finditer(line))
        if stated and _trim(stated[-1].group(1)):
            return AnswerRead(_trim(stated[-1].group(1)), "answer_line")
    if lines:
        return AnswerRead(_trim(lines[-1]) or lines[-1].strip(), "last_line")
    return AnswerRead("", "none")


def extract_answer(text: str) -> tuple[str, bool]:
    """Return `read_answer`'s answer and whether it came from answer tags (complete or open)."""
    read = read_answer(text)
    return read.answer, read.source in ("tags", "open_tag")
