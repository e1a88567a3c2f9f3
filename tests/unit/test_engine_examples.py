"""Worked examples the small engine is shown: the generator's answers, a tool's worked call."""

from __future__ import annotations

import dataclasses
import json
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage

from fakes import FakeChatModel
from flowlearn.evals.cases import ANSWER_INSTRUCTION, with_answer_instruction
from flowlearn.graphs import Context
from flowlearn.nodes import make_executor as _make_executor
from flowlearn.nodes import make_generator as _make_generator
from flowlearn.nodes import make_verifier as _make_verifier
from flowlearn.nodes.executor import call_example_turns
from flowlearn.nodes.render import bare_question
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS
from flowlearn.nodes.smollm2 import WORKED_ANSWERS as GENERATOR_EXAMPLES
from flowlearn.nodes.smollm2 import order_by_form as ordered_examples
from flowlearn.nodes.tools import default_tools

STATE: dict[str, Any] = {
    "question": "What is 5 * 7?",
    "analysis": "A LONG RAMBLING ANALYSIS",
    "started_at": 0.0,
    "memory": [
        {
            "turn": 1,
            "kind": "action",
            "tool": "python",
            "sub_goal": "Compute 5 * 7.",
            "arguments": {"code": "5 * 7"},
            "result": "35\n",
            "error": None,
        },
    ],
}

make_executor = partial(_make_executor, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin
make_generator = partial(_make_generator, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin
make_verifier = partial(_make_verifier, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin


def runtime() -> Any:
    return SimpleNamespace(context=Context())


def recording(text: str, seen: list[list[BaseMessage]]) -> FakeChatModel:
    def respond(messages: list[BaseMessage], tools: list[dict[str, Any]]) -> Any:
        seen.append(messages)
        if tools:
            return AIMessage(
                "", tool_calls=[{"name": "python", "args": {"code": "5 * 7"}, "id": "1"}]
            )
        return AIMessage(text)

    return FakeChatModel(respond=respond)


def search_step(sentence: str) -> dict[str, Any]:
    result = f"[1] (id: a) A\n{sentence}\n\n[2] (id: b) B\nSomething else."
    return {**STATE["memory"][0], "tool": "local_search", "result": result}


def test_the_memorys_tool_examples_come_last_the_nearest_in_form_last() -> None:
    python, negative, quantity, author, dam, kenya, mountain = GENERATOR_EXAMPLES
    assert [e[0] for e in (quantity, author, dam, kenya, mountain)] == [
        "How long is the Kora Bridge, in metres?",
        "Who wrote the novel The Glass Road?",
        "Who built the Tana Dam?",
        "What is the capital of Kenya?",
        "What is the highest mountain of Japan?",
    ]
    assert quantity[2].endswith("<answer>412</answer>")  # the number, not "412 metres"
    assert negative[2].endswith("<answer>-86</answer>")  # the sign kept
    lookups = [quantity, author, dam, kenya, mountain]
    # python's result: its examples last, the one printing a number of the same sign last.
    assert ordered_examples(STATE["memory"], GENERATOR_EXAMPLES) == [*lookups, negative, python]
    below = [{**STATE["memory"][0], "result": "-1266\n"}]
    assert ordered_examples(below, GENERATOR_EXAMPLES)[-2:] == [python, negative]
    # A lookup: the worked answer whose first passage reads most like the memory's comes last.
    nearest = {
        "Ligu is the largest city in Pukaia.": kenya,  # the answer opens the sentence
        "The national animal of Rowiia is the Pekai.": mountain,  # ... or ends it
        "The Zoneo Symphony was composed by Vuzu Bumeoheo.": dam,  # "was ... by"
        "The Kipa Road is a film directed by Hosu Redoto.": author,  # "is a ... by"
        "The Hive Tower is 593 metres tall.": quantity,
    }
    for sentence, example in nearest.items():
        shown = ordered_examples([search_step(sentence)], GENERATOR_EXAMPLES)
        assert shown[:2] == [python, negative] and shown[-1] == example, sentence
        assert sorted(shown[2:], key=GENERATOR_EXAMPLES.index) == lookups
    # Without the form, the memory's tool's examples keep their order (as before session 25).
    search = search_step("The national animal of Rowiia is the Pekai.")
    both = [STATE["memory"][0], search]  # the last call decides
    assert ordered_examples(both, GENERATOR_EXAMPLES)[-1] == mountain
    assert ordered_examples([], GENERATOR_EXAMPLES) == list(GENERATOR_EXAMPLES)
    unknown = [{**search, "tool": "my_tool"}]
    assert ordered_examples(unknown, GENERATOR_EXAMPLES) == list(GENERATOR_EXAMPLES)
    failed = [{**STATE["memory"][0], "result": None, "error": "Error (exit code 1): boom"}]
    assert ordered_examples(failed, GENERATOR_EXAMPLES)[:5] == lookups  # an error still orders


def test_the_generator_sees_worked_answers_first_and_no_query_analysis() -> None:
    seen: list[list[BaseMessage]] = []
    update = make_generator(recording("So. <answer>35</answer>", seen))(STATE, runtime())
    (messages,) = seen
    roles = [m.type for m in messages]
    assert roles == ["system", *["human", "ai"] * len(GENERATOR_EXAMPLES), "human"]
    python_last = ordered_examples(STATE["memory"], GENERATOR_EXAMPLES)
    assert python_last[-1][1][0]["tool"] == "python"  # the memory's tool's example comes last
    for (question, _, answer), shown, replied in zip(
        python_last, messages[1:-1:2], messages[2:-1:2], strict=True
    ):
        assert f"Question: {question}" in shown.text and replied.text == answer
        assert "<answer>" in answer  # each example answers in the tags, only the answer
    asked = messages[-1].text
    assert "What is 5 * 7?" in asked and "Result: 35" in asked
    assert "RAMBLING" not in asked  # the analysis is left out
    # Tool arguments and sub-goals are left out of every memory it reads, the examples' too.
    assert all("Arguments:" not in m.text and "Sub-Goal:" not in m.text for m in messages)
    assert "Step 1 (tool python):\n  Result: 35" in asked
    assert update["answer"] == "35"
    # The transition records exactly what the engine read, examples included.
    assert len(update["transitions"][0]["messages"]) == len(messages)


def test_generator_and_executor_read_the_question_without_the_answer_instruction() -> None:
    seen: list[list[BaseMessage]] = []
    state = {**STATE, "question": with_answer_instruction("What is 5 * 7?")}
    make_generator(recording("<answer>35</answer>", seen))(state, runtime())
    assert "Question: What is 5 * 7?\n\nMemory" in seen[0][-1].text
    assert ANSWER_INSTRUCTION not in seen[0][-1].text
    plan = {"turn": 1, "justification": "", "context": "", "sub_goal": "5*7", "tool": "python"}
    tools = [{t.name: t for t in default_tools(None)}["python"]]
    make_executor(recording("", seen), tools)({**state, "plan": plan}, runtime())
    assert "Question: What is 5 * 7?\nContext:" in seen[1][-1].text
    assert ANSWER_INSTRUCTION not in seen[1][-1].text
    assert bare_question("Q?\n" + ANSWER_INSTRUCTION) == "Q?"
    assert bare_question("Q without it") == "Q without it"


def test_the_verifier_still_reads_the_tool_arguments() -> None:
    seen: list[list[BaseMessage]] = []
    make_verifier(recording("Conclusion: STOP", seen))(STATE, runtime())
    assert 'Arguments: {"code": "5 * 7"}' in seen[0][-1].text


def test_the_python_and_search_tools_show_the_executor_a_worked_call() -> None:
    tools = {t.name: t for t in default_tools(None)}
    turns = call_example_turns(tools["python"], SMOLLM2_PROMPTS)
    assert [t["role"] for t in turns] == ["user", "assistant"] * 3
    codes = [json.loads(t["content"])["arguments"]["code"] for t in turns[1::2]]
    assert codes == ["8 + 15 + 27", "620 - 75", "12 * 34"]  # a sum, a reversed difference, ...
    assert "Question: How much is 75 less than 620?" in turns[2]["content"]
    assert all(
        "Sub-Goal: Compute the question's expression with code." in t["content"] for t in turns[::2]
    )
    search = call_example_turns(tools["local_search"], SMOLLM2_PROMPTS)
    assert len(search) == 6
    for asked, replied in zip(search[::2], search[1::2], strict=True):
        query = json.loads(replied["content"])["arguments"]["query"]
        assert f"Question: {query}\n" in asked["content"]  # the question, word for word
    assert "What is the capital of Kenya?" in search[-1]["content"]
    seen: list[list[BaseMessage]] = []
    plan = {
        "turn": 1,
        "justification": "",
        "context": "5 and 7",
        "sub_goal": "5*7",
        "tool": "python",
    }
    make_executor(recording("", seen), [tools["python"]])({**STATE, "plan": plan}, runtime())
    (messages,) = seen
    assert [m.type for m in messages] == ["system", *["human", "ai"] * 3, "human"]
    assert "Sub-Goal: 5*7" in messages[-1].text  # the real call comes last


def test_a_tool_may_carry_one_worked_call_but_not_both_keys() -> None:
    (tool,) = [t for t in default_tools(None) if t.name == "python"]
    one = {"question": "Q?", "context": "C", "sub_goal": "S", "arguments": {"code": "1 + 1"}}
    tool.metadata = {"call_example": one}
    turns = call_example_turns(tool)
    assert json.loads(turns[1]["content"])["arguments"] == {"code": "1 + 1"}
    tool.metadata = {"call_example": one, "call_examples": [one]}
    with pytest.raises(ValueError, match="keep one"):
        call_example_turns(tool)
    tool.metadata = {}
    assert call_example_turns(tool) == []
    tool.metadata = {"call_examples": one}  # one call given where a list belongs
    with pytest.raises(ValueError, match="must be a list of dicts"):
        call_example_turns(tool)


def test_worked_lookup_replies_open_with_what_the_question_asks_only_after_a_lookup() -> None:
    search = {**STATE["memory"][0], "tool": "local_search", "result": "[1] (id: x) X\nX."}
    seen: list[list[BaseMessage]] = []
    make_generator(recording("<answer>X</answer>", seen))({**STATE, "memory": [search]}, runtime())
    replies = [m.text for m in seen[0][2:-1:2]]
    assert replies[0] == GENERATOR_EXAMPLES[0][2]  # python's, first and as written
    assert replies[-1].startswith("The question asks for the capital of Kenya. The first passage")
    assert replies[1] == GENERATOR_EXAMPLES[1][2]  # python's negative one, as written
    assert sum(r.startswith("The question asks for") for r in replies) == 5
    make_generator(recording("<answer>35</answer>", seen))(STATE, runtime())  # python's memory
    assert not any("The question asks for" in m.text for m in seen[1])


def test_the_executor_sees_earlier_results_only_when_its_view_asks() -> None:
    """`MemoryView.results`: the earlier calls' results follow the plan's context; errors,
    verdicts and format errors do not, and AgentFlow's view (off) shows the plan alone."""
    tools = [{t.name: t for t in default_tools(None)}["python"]]
    lookup = search_step("Mount Palur is 4469 metres high.")
    memory = [
        lookup,
        {"turn": 2, "kind": "action", "tool": "python", "result": None, "error": "boom"},
        {"turn": 2, "kind": "verification", "verdict": "CONTINUE", "analysis": "more"},
        {"turn": 3, "kind": "format_error", "error": "no tool named"},
    ]
    plan = {
        "turn": 4,
        "justification": "",
        "context": "PLAN CONTEXT",
        "sub_goal": "x",
        "tool": "python",
    }
    state = {**STATE, "memory": memory, "plan": plan}
    seen: list[list[BaseMessage]] = []
    make_executor(recording("", seen), tools)(state, runtime())
    view = dataclasses.replace(SMOLLM2_PROMPTS.executor_view, results=True)
    prompts = dataclasses.replace(SMOLLM2_PROMPTS, executor_view=view)
    _make_executor(recording("", seen), tools, prompts=prompts)(state, runtime())
    plain, with_results = seen[0][-1].text, seen[1][-1].text
    assert "PLAN CONTEXT" in plain and "Mount Palur" not in plain
    assert f"PLAN CONTEXT\n{lookup['result']}" in with_results
    assert "boom" not in with_results and "CONTINUE" not in with_results
    assert "no tool named" not in with_results
    # The worked calls are rendered as before: only the real call's context grows.
    assert [m.text for m in seen[0][:-1]] == [m.text for m in seen[1][:-1]]
