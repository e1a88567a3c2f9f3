from __future__ import annotations

from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import Context
from flowlearn.nodes import make_executor as _make_executor
from flowlearn.nodes import make_generator as _make_generator
from flowlearn.nodes import make_planner as _make_planner
from flowlearn.nodes import make_verifier as _make_verifier
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS

make_executor = partial(_make_executor, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin
make_generator = partial(_make_generator, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin
make_planner = partial(_make_planner, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin
make_verifier = partial(_make_verifier, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def broken(query: str) -> str:
    """Always fails."""
    raise RuntimeError("backend down")


def runtime(**kwargs: Any) -> Any:
    return SimpleNamespace(context=Context(**kwargs))


def test_planner_first_visit_analyses_then_plans() -> None:
    policy = ScriptedPolicy([plan("Add", sub_goal="add 2 and 3")])
    engine = FakeChatModel(text="Goal: add numbers.")
    node = make_planner(policy, [add], analysis_engine=engine)
    update = node({"question": "2+3?"}, runtime(query_analysis=True))
    assert update["analysis"] == "Goal: add numbers."
    assert update["turn"] == 1
    assert update["plan"]["tool"] == "add"
    assert update["plan"]["sub_goal"] == "add 2 and 3"
    analysis, turn = update["transitions"]
    assert analysis["node"] == "query_analysis"
    assert turn["node"] == "planner" and turn["parse_status"] == "ok"
    assert turn["completion_ids"] and len(turn["logprobs"]) == len(turn["completion_ids"])
    assert turn["sampling"]["temperature"] == 0.0  # greedy by default, as AgentFlow infers
    assert "add: Add two integers." in policy.calls[0][-1]["content"]


def test_query_analysis_reads_the_brief_catalogue_and_the_planner_the_full_one() -> None:
    @tool
    def search(query: str) -> str:
        """Search the notes."""
        return query

    search.metadata = {"usage_notes": "Run a Python 3 program here? No: short queries."}
    policy = ScriptedPolicy([plan("search")])
    engine = FakeChatModel(text="Goal: find it.")
    node = make_planner(policy, [search, add], analysis_engine=engine)
    node({"question": "q?"}, runtime(query_analysis=True))
    analysed = str(engine.calls[0][-1].content)
    assert "- search: Search the notes.\n- add: Add two integers." in analysed
    assert "Usage notes" not in analysed and "Arguments" not in analysed
    planned = policy.calls[0][-1]["content"]
    assert "Usage notes: Run a Python 3 program here?" in planned and "Arguments:" in planned


def test_without_query_analysis_no_engine_call_and_no_section_in_any_prompt() -> None:
    policy = ScriptedPolicy([plan("add")] * 2)
    engine = FakeChatModel(text="Goal: add numbers.")
    node = make_planner(policy, [add], analysis_engine=engine)
    update = node({"question": "2+3?"}, runtime())  # off by default
    assert "analysis" not in update and engine.calls == []
    assert [t["node"] for t in update["transitions"]] == ["planner"]
    asked = policy.calls[0][-1]["content"]
    assert "Query analysis" not in asked and "Question: 2+3?\n\nAvailable tools:" in asked
    node({"question": "2+3?", "analysis": "LEFT OVER"}, runtime())  # off: never shown
    assert "LEFT OVER" not in policy.calls[1][-1]["content"]
    verifier_engine = FakeChatModel(text="Done.\nConclusion: STOP")
    state = {"question": "2+3?", "analysis": "LEFT OVER", "memory": [], "turn": 1}
    make_verifier(verifier_engine)(state, runtime())
    judged = str(verifier_engine.calls[0][-1].content)
    assert "Query analysis" not in judged and "LEFT OVER" not in judged
    make_verifier(verifier_engine)(state, runtime(query_analysis=True))
    assert "Query analysis:\nLEFT OVER" in str(verifier_engine.calls[1][-1].content)
    with pytest.raises(ValueError, match="true or false or null"):
        Context(query_analysis="false")  # type: ignore[arg-type]


def test_planner_unknown_tool_is_a_recorded_format_error() -> None:
    node = make_planner(ScriptedPolicy(["nonsense", plan("teleport")]), [add])
    first = node({"question": "q", "analysis": "a"}, runtime())
    assert first["plan"] is None and first["turn"] == 1
    assert first["memory"][0]["kind"] == "format_error"
    assert first["transitions"][0]["parse_status"] == "format_error"
    second = node({"question": "q", "analysis": "a", "turn": 1}, runtime())
    assert second["transitions"][0]["parse_status"] == "unknown_tool"
    assert "teleport" in second["memory"][0]["error"]


def test_planner_only_offers_enabled_tools() -> None:
    policy = ScriptedPolicy([plan("add")])
    node = make_planner(policy, [add, broken])
    update = node({"question": "q", "analysis": "a"}, runtime(tools=("broken",)))
    assert update["plan"] is None  # `add` is bound but not enabled in this run
    assert "add:" not in policy.calls[0][-1]["content"]
    with pytest.raises(ValueError, match="not bound"):
        node({"question": "q", "analysis": "a"}, runtime(tools=("nope",)))


def test_planner_spent_budget_skips_the_policy() -> None:
    policy = ScriptedPolicy([plan("add")])
    node = make_planner(policy, [add])
    assert node({"question": "q", "turn": 2}, runtime(max_turns=2)) == {
        "termination": "max_turns",
        "plan": None,
    }
    assert policy.calls == []


def test_executor_runs_tool_with_engine_arguments() -> None:
    engine = FakeChatModel(default_args={"a": 2, "b": 3})
    node = make_executor(engine, [add])
    state = {
        "question": "q",
        "plan": {"turn": 1, "justification": "", "context": "c", "sub_goal": "add", "tool": "add"},
    }
    update = node(state, runtime())
    record = update["memory"][0]
    assert record["arguments"] == {"a": 2, "b": 3}
    assert record["result"] == "5" and record["error"] is None
    assert record["seconds"] >= 0
    assert update["transitions"][0]["node"] == "executor"


def test_executor_reads_json_when_engine_has_no_tool_call() -> None:
    engine = FakeChatModel(respond=lambda m, t: 'Sure: {"a": 1, "b": 1}')
    node = make_executor(engine, [add])
    state = {
        "question": "q",
        "plan": {"turn": 1, "justification": "", "context": "", "sub_goal": "add", "tool": "add"},
    }
    assert node(state, runtime())["memory"][0]["result"] == "2"


def test_executor_tool_exception_becomes_error_record() -> None:
    engine = FakeChatModel(default_args={"query": "x"})
    node = make_executor(engine, [broken])
    state = {
        "question": "q",
        "plan": {"turn": 1, "justification": "", "context": "", "sub_goal": "s", "tool": "broken"},
    }
    record = node(state, runtime())["memory"][0]
    assert record["result"] is None
    assert record["error"] == "RuntimeError: backend down"


def test_executor_unusable_arguments_are_recorded() -> None:
    engine = FakeChatModel(respond=lambda m, t: AIMessage(content="no idea"))
    node = make_executor(engine, [add])
    state = {
        "question": "q",
        "plan": {"turn": 1, "justification": "", "context": "", "sub_goal": "s", "tool": "add"},
    }
    update = node(state, runtime())
    assert "no usable arguments" in update["memory"][0]["error"]
    assert update["transitions"][0]["parse_status"] == "format_error"


@pytest.mark.parametrize(
    ("text", "verdict", "status"),
    [("All found.\nConclusion: STOP", "STOP", "ok"), ("hmm", "CONTINUE", "unclear")],
)
def test_verifier_stores_verdict_in_memory(text: str, verdict: str, status: str) -> None:
    update = make_verifier(FakeChatModel(text=text))({"question": "q", "turn": 1}, runtime())
    assert update["verdict"] == verdict
    assert update["memory"][0] == {
        "turn": 1,
        "kind": "verification",
        "analysis": text,
        "verdict": verdict,
    }
    assert update["transitions"][0]["parse_status"] == status
    assert ("termination" in update) == (verdict == "STOP")


@pytest.mark.parametrize("echoes_prefill", [True, False])
def test_verifier_without_conclusion_is_asked_to_conclude(echoes_prefill: bool) -> None:
    def respond(messages: list[Any], tools: list[Any]) -> str:
        if isinstance(messages[-1], AIMessage):  # the follow-up: continue after the label
            return f"{messages[-1].content} STOP" if echoes_prefill else "STOP"
        return "The answer is 42."

    engine = FakeChatModel(respond=respond)
    update = make_verifier(engine)({"question": "q", "turn": 2}, runtime())
    assert update["verdict"] == "STOP" and update["termination"] == "verifier_stop"
    assert update["memory"][0]["analysis"] == "The answer is 42.\nConclusion: STOP"
    first, second = update["transitions"]
    assert (first["parse_status"], second["parse_status"]) == ("unclear", "ok")
    assert first["turn"] == second["turn"] == 2
    assert second["messages"][-1] == {
        "role": "assistant",
        "content": "The answer is 42.\nConclusion:",
    }
    assert len(engine.calls) == 2


def test_verifier_that_concludes_is_called_once() -> None:
    engine = FakeChatModel(text="Found.\nConclusion: CONTINUE")
    update = make_verifier(engine)({"question": "q", "turn": 1}, runtime())
    assert update["verdict"] == "CONTINUE" and len(update["transitions"]) == 1
    assert len(engine.calls) == 1


def test_generator_extracts_answer() -> None:
    text = "17*23 is 391. <answer>391</answer>"
    update = make_generator(FakeChatModel(text=text))(
        {"question": "q", "started_at": 0.0}, runtime()
    )
    assert update["final_text"] == text and update["answer"] == "391"
    untagged = make_generator(FakeChatModel(text="391"))({"question": "q"}, runtime())
    assert untagged["answer"] == "391"
    assert untagged["transitions"][0]["parse_status"] == "no_answer_tags"


class PrefillingScript(ScriptedPolicy):  # type: ignore[misc]
    """A scripted policy that continues a final assistant message, as HFPolicy does."""

    continues_prefill = True


@pytest.mark.parametrize("prefills", [True, False])
def test_a_trained_verifier_samples_both_calls_from_its_policy(prefills: bool) -> None:
    engine = FakeChatModel(text="Conclusion: STOP")  # never asked: the policy judges
    policy = (PrefillingScript if prefills else ScriptedPolicy)(
        ["The answer is 42.", " CONTINUE\nmore"]
    )
    node = make_verifier(engine, policy=policy, top_p=0.9, max_new_tokens=7)
    update = node({"question": "q", "turn": 2}, runtime(planner_temperature=0.7, seed=3))
    assert engine.calls == [] and len(policy.calls) == 2
    assert update["verdict"] == "CONTINUE" and "termination" not in update
    assert update["memory"][0]["analysis"] == "The answer is 42.\nConclusion: CONTINUE"
    first, second = update["transitions"]
    assert (first["parse_status"], second["parse_status"]) == ("unclear", "ok")
    for record in (first, second):  # token-exact records, trainable rows of the verifier
        assert record["node"] == "verifier" and record["completion_ids"] and record["logprobs"]
        assert record["sampling"]["temperature"] == 0.7 and record["sampling"]["top_p"] == 0.9
    assert first["sampling"]["max_new_tokens"] == 7
    assert first["sampling"]["seed"] != second["sampling"]["seed"]  # each call its own draw
    if prefills:  # the follow-up continues the reply after the label
        assert second["messages"][-1] == {
            "role": "assistant",
            "content": "The answer is 42.\nConclusion:",
        }
    else:  # asked anew
        assert second["messages"][-1] == {"role": "user", "content": "Conclusion:"}
