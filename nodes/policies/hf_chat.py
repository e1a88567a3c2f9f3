"""A LangChain chat model over a local Hugging Face policy, usable as the fixed engine.

langchain-huggingface's chat model cannot return token ids and rejects tool messages; this one
shares the planner's backend (one model in memory), streams tokens, and supports tool calling
with a JSON convention small local models can follow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from flowlearn.nodes.policies.hf import LocalPolicy, stream_text
from flowlearn.nodes.schema.sampling import Messages, Sampling

TOOL_CALL_INSTRUCTIONS = """\
You can call these tools:
{tools}
To call a tool, reply with only a JSON object: {{"name": "<tool name>", "arguments": {{...}}}}"""


def to_chat_dicts(messages: Sequence[BaseMessage]) -> Messages:
    """Convert LangChain messages to role/content dicts any chat template accepts.

    Tool calls are written as the JSON the model is asked to produce; tool results become user
    turns, since many chat templates have no `tool` role.
    """
    out: Messages = []
    for message in messages:
        if isinstance(message, SystemMessage):
            out.append({"role": "system", "content": message.text})
        elif isinstance(message, AIMessage):
            calls = [
                json.dumps({"name": c["name"], "arguments": c["args"]}) for c in message.tool_calls
            ]
            out.append({"role": "assistant", "content": "\n".join([message.text, *calls]).strip()})
        elif isinstance(message, ToolMessage):
            out.append({"role": "user", "content": f"Tool result ({message.name}): {message.text}"})
        else:
            out.append({"role": "user", "content": message.text})
    return out


def parse_tool_calls(
    text: str, tools: Sequence[dict[str, Any]], tool_choice: str | None
) -> list[dict[str, Any]]:
    """Read `{"name", "arguments"}` JSON objects out of a reply; never raises.

    With a forced `tool_choice`, a bare JSON object is taken as that tool's arguments.
    """
    decoder = json.JSONDecoder()
    names = {t["function"]["name"] for t in tools}
    calls: list[dict[str, Any]] = []
    index = 0
    while (start := text.find("{", index)) != -1:
        try:
            value, index = decoder.raw_decode(text, start)
        except ValueError:
            value, index = _close_json(text[start:]), start + 1
            if value is None:
                continue
        if not isinstance(value, dict):
            continue
        name, args = value.get("name"), value.get("arguments", value.get("args"))
        if isinstance(name, str) and name in names and isinstance(args, dict):
            calls.append({"name": name, "args": args, "id": f"call_{len(calls)}"})
        elif tool_choice in names and not calls:
            calls.append({"name": tool_choice, "args": value, "id": "call_0"})
    return calls


def _close_json(fragment: str) -> Any:
    """Parse a JSON object a model left unclosed (ran out of tokens, or stopped early)."""
    decoder = json.JSONDecoder()
    for closing in ("}", "}}", '"}', '"}}'):
        try:
            return decoder.raw_decode(fragment.rstrip().rstrip(",") + closing)[0]
        except ValueError:
            continue
    return None


class HFChatModel(BaseChatModel):
    """Chat model over a `LocalPolicy` (`HFPolicy`, `BatchingPolicy`): greedy, as an engine."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    policy: LocalPolicy = Field(exclude=True)
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 512

    @property
    def _llm_type(self) -> str:
        return "flowlearn-hf"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model": self.policy.version, "temperature": self.temperature}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; the model is told to answer with a JSON tool call."""
        schemas = [convert_to_openai_tool(tool) for tool in tools]
        if tool_choice in ("any", "required") and len(schemas) == 1:
            tool_choice = schemas[0]["function"]["name"]
        return self.bind(tools=schemas, tool_choice=tool_choice, **kwargs)

    def _prepare(
        self, messages: list[BaseMessage], kwargs: dict[str, Any]
    ) -> tuple[Messages, Sampling, list[dict[str, Any]], str | None]:
        chat = to_chat_dicts(messages)
        tools: list[dict[str, Any]] = kwargs.get("tools") or []
        choice = kwargs.get("tool_choice")
        if isinstance(choice, dict):
            choice = choice.get("function", {}).get("name")
        if tools:
            listing = "\n".join(json.dumps(t["function"]) for t in tools)
            note = TOOL_CALL_INSTRUCTIONS.format(tools=listing)
            if chat and chat[0]["role"] == "system":
                chat[0] = {"role": "system", "content": f"{chat[0]['content']}\n\n{note}"}
            else:
                chat.insert(0, {"role": "system", "content": note})
        forced = [t["function"] for t in tools if t["function"]["name"] == choice]
        if forced:
            # Prefill the call's opening so even a small model writes the arguments object.
            chat.append({"role": "assistant", "content": _call_prefix(forced[0])})
        sampling = Sampling(
            temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p),
            max_new_tokens=kwargs.get("max_new_tokens", self.max_new_tokens),
        )
        return chat, sampling, tools, choice

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        chat, sampling, tools, choice = self._prepare(messages, kwargs)
        gen = self.policy.generate(chat, sampling)
        prefill = chat[-1]["content"] if chat[-1]["role"] == "assistant" else ""
        text = _cut_at_stop(prefill + gen.text, stop)
        calls = parse_tool_calls(text, tools, choice) if tools else []
        if not calls and prefill:
            calls = _salvage_forced_call(prefill, _cut_at_stop(gen.text, stop))
        message = AIMessage(
            content="" if calls else text,
            tool_calls=calls,
            response_metadata={
                "model": self.policy.version,
                "prompt_ids": gen.prompt_ids,
                "completion_ids": gen.completion_ids,
                "logprobs": gen.logprobs,
            },
            usage_metadata={
                "input_tokens": len(gen.prompt_ids or []),
                "output_tokens": len(gen.completion_ids or []),
                "total_tokens": len(gen.prompt_ids or []) + len(gen.completion_ids or []),
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        chat, sampling, tools, _ = self._prepare(messages, kwargs)
        if tools:  # a tool call is only known once the whole JSON is there
            result = self._generate(messages, stop, run_manager, **kwargs)
            message = result.generations[0].message
            assert isinstance(message, AIMessage)
            yield ChatGenerationChunk(
                message=AIMessageChunk(content=message.content, tool_calls=message.tool_calls)
            )
            return
        text = ""
        for piece in stream_text(self.policy, chat, sampling):
            if stop and any(s in text + piece for s in stop):
                piece = _cut_at_stop(text + piece, stop)[len(text) :]
                if piece:
                    yield _chunk(piece, run_manager)
                return
            text += piece
            if piece:
                yield _chunk(piece, run_manager)


def _call_prefix(function: dict[str, Any]) -> str:
    """Open a call's JSON up to its first argument's value."""
    head = '{"name": ' + json.dumps(function["name"]) + ', "arguments": {'
    params = function.get("parameters", {})
    props: dict[str, Any] = params.get("properties", {})
    first = next(iter(params.get("required") or props), None)
    if first is None:
        return head
    quote = '"' if props.get(first, {}).get("type") == "string" else ""
    return f"{head}{json.dumps(first)}: {quote}"


def _salvage_forced_call(prefill: str, completion: str) -> list[dict[str, Any]]:
    """Read a forced call whose JSON never closed: the first string argument runs to its quote.

    This is what constrained decoding would have produced; without it a small model's stray
    quote would cost the whole call.
    """
    if not prefill.endswith('"'):
        return []
    opened = json.loads(prefill + '"}}')  # the prefill with an empty first value
    (first,) = opened["arguments"]
    raw = re.split(r'(?<!\\)"', completion, maxsplit=1)[0]
    try:
        value = json.loads(f'"{raw}"')
    except ValueError:
        value = raw
    return [{"name": opened["name"], "args": {first: value}, "id": "call_0"}]


def _chunk(piece: str, run_manager: CallbackManagerForLLMRun | None) -> ChatGenerationChunk:
    chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
    if run_manager:
        run_manager.on_llm_new_token(piece, chunk=chunk)
    return chunk


def _cut_at_stop(text: str, stop: list[str] | None) -> str:
    for token in stop or []:
        if token in text:
            text = text[: text.index(token)]
    return text
