"""Scripted backends: a policy and a chat model that reply from a script (no model needed)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field

from flowlearn.engine.sampling import Generation, Messages, Sampling


class ScriptedPolicy:
    """Reply with scripted texts in turn (the last one repeats); a reply may be a function.

    It invents token ids and logprobs, one per character, so the transition plumbing (and
    training on the transitions) runs end to end without a model. `calls` records every chat it
    was given.
    """

    def __init__(self, replies: Sequence[str | Callable[[Messages], str]]) -> None:
        """Script the replies: a text, or a function of the chat that returns one.

        Raises:
            ValueError: no replies.

        """
        if not replies:
            raise ValueError("a scripted policy needs at least one reply")
        self.replies = list(replies)
        self.calls: list[Messages] = []
        self.version = "scripted-0"

    def generate(self, messages: Messages, sampling: Sampling) -> Generation:
        """Return the next scripted reply, with ids and logprobs made up from its characters."""
        index = min(len(self.calls), len(self.replies) - 1)
        self.calls.append(messages)
        reply = self.replies[index]
        text = reply(messages) if callable(reply) else reply
        return Generation(
            text=text,
            prompt_ids=[ord(c) % 256 for c in messages[-1]["content"][:32]],
            completion_ids=[ord(c) % 256 for c in text],
            logprobs=[-0.5] * len(text),
            policy_version=self.version,
            sampling=sampling.as_dict(),
            seconds=0.001,
        )


def planner_turn(tool: str, sub_goal: str = "compute it", context: str = "none") -> str:
    """Return a well-formed planner turn naming `tool`."""
    return (
        f"Tool Name: {tool}\nJustification: the tool fits.\nContext: {context}\n"
        f"Sub-Goal: {sub_goal}"
    )


Responder = Callable[[list[BaseMessage], list[dict[str, Any]]], AIMessage | str]


class ScriptedChatModel(BaseChatModel):
    """A chat model whose replies come from a function of (messages, bound tools).

    `bind_tools` is supported, so it serves as the executor's engine; by default it calls the
    first bound tool with `default_args` and answers everything else with `text`.
    """

    respond: Responder | None = None
    text: str = "Conclusion: STOP\n<answer>42</answer>"
    default_args: dict[str, Any] = Field(default_factory=dict)
    calls: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted-chat"

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind the tools' names, so replies can call the first one."""
        schemas = [{"name": convert_to_openai_tool(t)["function"]["name"]} for t in tools]
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        return self.bind(tools=schemas, **kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.calls.append(messages)
        tools = kwargs.get("tools") or []
        if self.respond is not None:
            reply = self.respond(messages, tools)
        elif tools:
            reply = AIMessage(
                content="",
                tool_calls=[{"name": tools[0]["name"], "args": self.default_args, "id": "call-1"}],
            )
        else:
            reply = self.text
        message = reply if isinstance(reply, AIMessage) else AIMessage(content=reply)
        return ChatResult(generations=[ChatGeneration(message=message)])
