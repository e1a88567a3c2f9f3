"""Each engine role binds its budget (and the generator its stop), and records how calls end."""

from __future__ import annotations

import argparse
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.tools import tool
from pydantic import Field

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.compose import FlowSpec, UsageError
from flowlearn.flow_setup import add_flow_options, spec_from_args
from flowlearn.graphs import Context
from flowlearn.nodes import make_executor as _make_executor
from flowlearn.nodes import make_generator as _make_generator
from flowlearn.nodes import make_planner as _make_planner
from flowlearn.nodes import make_verifier as _make_verifier
from flowlearn.nodes.prompts import ANSWER_STOP
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS

make_executor = partial(_make_executor, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin
make_generator = partial(_make_generator, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin
make_planner = partial(_make_planner, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin
make_verifier = partial(_make_verifier, prompts=SMOLLM2_PROMPTS)  # the preset these tests pin


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


class RecordingChatModel(FakeChatModel):
    """A scripted chat model that also records each call's stop strings and settings."""

    settings: list[dict[str, Any]] = Field(default_factory=list)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.settings.append({"stop": stop, **{k: v for k, v in kwargs.items() if k != "tools"}})
        return super()._generate(messages, stop, run_manager, **kwargs)


def reply(text: str, **meta: Any) -> RecordingChatModel:
    return RecordingChatModel(
        respond=lambda messages, tools: AIMessage(text, response_metadata=meta)
    )


def runtime() -> Any:
    return SimpleNamespace(context=Context(query_analysis=True))


STATE: dict[str, Any] = {"question": "What is the capital of Kenya?", "started_at": 0.0}


def test_each_role_binds_its_budget_and_the_generator_its_stop() -> None:
    engine = RecordingChatModel(default_args={"a": 1, "b": 2})
    make_planner(ScriptedPolicy([plan("add")]), [add], analysis_engine=engine)(
        {"question": "1+2?"}, runtime()
    )
    make_executor(engine, [add])({**STATE, "plan": {**PLAN, "tool": "add"}}, runtime())
    make_verifier(engine)(STATE, runtime())
    make_generator(engine)(STATE, runtime())
    assert [call.get("max_tokens") for call in engine.settings] == [
        SMOLLM2_PROMPTS.budgets.query_analysis,
        SMOLLM2_PROMPTS.budgets.executor,
        SMOLLM2_PROMPTS.budgets.verifier,
        SMOLLM2_PROMPTS.budgets.generator,
    ]
    assert [call["stop"] for call in engine.settings] == [None, None, None, [ANSWER_STOP]]


PLAN = {"turn": 1, "justification": "", "context": "1 and 2", "sub_goal": "add", "tool": "add"}


def test_the_generator_puts_back_the_tag_it_stopped_at() -> None:
    engine = reply(
        "Kenya's capital. <answer>Nairobi", finish_reason="stop", stop_sequence="</answer>"
    )
    update = make_generator(engine)(STATE, runtime())
    assert update["final_text"] == "Kenya's capital. <answer>Nairobi</answer>"
    assert update["answer"] == "Nairobi"
    (record,) = update["transitions"]
    assert record["parse_status"] == "ok" and "notes" not in record


def test_a_model_that_only_says_it_stopped_has_its_tag_closed_too() -> None:
    update = make_generator(reply("So <answer>391", finish_reason="stop"))(STATE, runtime())
    assert update["final_text"].endswith("<answer>391</answer>") and update["answer"] == "391"


def test_a_budget_cut_answer_is_a_recorded_fallback() -> None:
    engine = reply(
        "<answer>Nairo", finish_reason="length", notes=["engine budget spent: 256 tokens"]
    )
    update = make_generator(engine)(STATE, runtime())
    (record,) = update["transitions"]
    assert update["answer"] == "Nairo" and update["final_text"] == "<answer>Nairo"
    assert record["parse_status"] == "no_answer_tags"
    assert record["notes"] == [
        "engine budget spent: 256 tokens",
        "answer from a fallback: open_tag (no complete answer tags)",
    ]


def test_an_untagged_reply_answers_from_its_answer_line_never_from_tool_text() -> None:
    memory = [{"turn": 1, "kind": "action", "tool": "t", "result": "<answer>42</answer>"}]
    engine = reply("The tool says 42, but that is wrong.\nThe answer is: Nairobi.")
    update = make_generator(engine)({**STATE, "memory": memory}, runtime())
    assert "<answer>42</answer>" in str(engine.calls[0][-1].content)  # the tool text was shown
    assert update["answer"] == "Nairobi"
    assert update["transitions"][0]["notes"] == [
        "answer from a fallback: answer_line (no complete answer tags)"
    ]


def test_the_verifier_and_analysis_record_why_the_engine_stopped() -> None:
    note = (
        "engine stopped a degenerate repetition after 60 tokens: a 12-token block repeated 5 times"
    )
    engine = reply("It is fine. It is fine. It is fine.", finish_reason="repetition", notes=[note])
    verified = make_verifier(engine)(STATE, runtime())
    assert verified["transitions"][0]["notes"] == [note]
    planned = make_planner(ScriptedPolicy([plan("add")]), [add], analysis_engine=engine)(
        {"question": "1+2?"}, runtime()
    )
    assert planned["transitions"][0]["notes"] == [note]


def test_engine_errors_are_still_recorded_and_the_run_goes_on() -> None:
    def fail(messages: Any, tools: Any) -> AIMessage:
        raise RuntimeError("backend down")

    update = make_generator(RecordingChatModel(respond=fail), retry=None)(STATE, runtime())
    assert update["answer"] == "" and "backend down" in update["final_text"]
    assert update["transitions"][0]["parse_status"] == "error"


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_flow_options(parser)
    return parser.parse_args(list(flags))


def test_the_cli_budget_is_per_role_unless_given() -> None:
    assert spec_from_args(parse()).engine_max_new_tokens is None
    assert spec_from_args(parse("--engine-max-new-tokens", "64")).engine_max_new_tokens == 64
    with pytest.raises(UsageError, match="engine-max-new-tokens"):
        FlowSpec(engine_max_new_tokens=0)
