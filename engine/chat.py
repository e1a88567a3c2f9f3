"""The thin LangChain adapters: messages to and from the engine, and chat models over it.

1. `HFChatModel`: a LangChain chat model over a local policy, usable as the fixed engine.
   langchain-huggingface's chat model cannot return token ids and rejects tool messages; this
   one shares the planner's backend (one model in memory), streams tokens, and supports tool
   calling with a JSON convention small local models can follow (`TOOL_CALL_INSTRUCTIONS`). It
   honours LangChain's standard call settings: `stop` (an argument, a field, or
   `.bind(stop=[...])`) ends the call at the first stop string, and `max_tokens` (or
   `max_new_tokens`) sets the call's budget; a degenerate repetition ends it too
   (`stops.RepetitionRule`).
2. `ServerChatModel`: the fixed engine on an OpenAI-compatible server (vLLM), with
   `HFChatModel`'s conventions. Everything but the forward passes stays as for a local engine,
   so a flow behaves the same with its engine here or there, but for the verifier's follow-up (a
   served engine writes it, a local one chooses it: `scores_choices`). The model's chat template
   is applied here with its tokenizer and the prompt goes to `/v1/completions` as token ids
   (`ServerPolicy`); tools are called by the same JSON convention with the same prefill; stop
   strings travel as the request's `stop`, and the call's `StopWatch` (stop strings, a closed
   tool call, a degenerate repetition) is run over the ids the server returns, cutting them
   where a local decode would have stopped. This is how one vLLM server serves both roles while
   training: the planner's LoRA adapter under its own name, the engine as the base model
   (`--engine-url` with `--engine` naming it).
3. `ChatModelPolicy`: the other way round, any LangChain chat model as the planner's policy
   (inference only).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import ConfigDict, Field

from flowlearn.engine.local import LocalPolicy, ScoringPolicy, check_choices, choose, stream_text
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.server import ServerPolicy
from flowlearn.engine.stops import RepetitionRule, StopWatch, held_back

__all__ = [
    "ChatModelPolicy",
    "HFChatModel",
    "ServerChatModel",
    "parse_tool_calls",
    "read_tool_calls",
    "to_chat_dicts",
    "to_langchain",
    "tool_call_chat",
]

_CLASSES: dict[str, type[BaseMessage]] = {
    "system": SystemMessage,
    "user": HumanMessage,
    "assistant": AIMessage,
}


def to_langchain(messages: Sequence[dict[str, str]]) -> list[BaseMessage]:
    """Turn `{"role", "content"}` dicts into LangChain messages.

    Raises:
        ValueError: a role other than system, user or assistant.

    """
    out: list[BaseMessage] = []
    for message in messages:
        role = message["role"]
        if role not in _CLASSES:
            raise ValueError(f"unknown message role {role!r}; use one of {sorted(_CLASSES)}")
        out.append(_CLASSES[role](content=message["content"]))
    return out


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


class ChatModelPolicy:
    """Use any LangChain chat model as the planner, for inference only.

    Its transitions carry text but no token ids, so training refuses them. When the model has
    `temperature` / `top_p` fields (as most LangChain chat models do), the requested values are
    applied to a copy of it, so planner sampling settings are never silently dropped.
    """

    def __init__(self, model: BaseChatModel, *, version: str | None = None) -> None:
        self.model = model
        self.version = version or type(model).__name__

    def generate(self, messages: Messages, sampling: Sampling) -> Generation:
        """Call the chat model once and wrap its text."""
        model = self.model
        fields = type(model).model_fields
        update: dict[str, Any] = {
            k: getattr(sampling, k) for k in ("temperature", "top_p") if k in fields
        }
        if update:
            model = model.model_copy(update=update)
        start = time.perf_counter()
        reply = model.invoke(to_langchain(messages))
        return Generation(
            text=reply.text,
            policy_version=self.version,
            sampling=sampling.as_dict(),
            seconds=time.perf_counter() - start,
        )


# The JSON tool-call convention of the local chat model: instructions, parsing and salvage.

TOOL_CALL_INSTRUCTIONS = """\
You can call these tools:
{tools}
To call a tool, reply with only a JSON object: {{"name": "<tool name>", "arguments": {{...}}}}"""


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


def tool_call_chat(
    chat: Messages, tools: Sequence[dict[str, Any]], choice: str | None, *, prefill: bool = True
) -> Messages:
    """Return `chat` asking for a call of `tools` (OpenAI schemas) in the JSON convention.

    The tools' instructions join the system message; for a forced `choice` the call's opening
    is prefilled as the reply (`prefill`), so even a small model writes the arguments object.
    """
    chat = [dict(m) for m in chat]
    if tools:
        listing = "\n".join(json.dumps(t["function"]) for t in tools)
        note = TOOL_CALL_INSTRUCTIONS.format(tools=listing)
        if chat and chat[0]["role"] == "system":
            chat[0] = {"role": "system", "content": f"{chat[0]['content']}\n\n{note}"}
        else:
            chat.insert(0, {"role": "system", "content": note})
    forced = [t["function"] for t in tools if t["function"]["name"] == choice]
    if forced and prefill:
        chat.append({"role": "assistant", "content": call_prefix(forced[0])})
    return chat


def read_tool_calls(
    prefill: str, completion: str, tools: Sequence[dict[str, Any]], choice: str | None
) -> list[dict[str, Any]]:
    """Read the calls of a reply that continued `prefill` (salvaging a forced call's)."""
    calls = parse_tool_calls(prefill + completion, tools, choice) if tools else []
    if not calls and prefill:
        calls = salvage_forced_call(prefill, completion)
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


def call_prefix(function: dict[str, Any]) -> str:
    """Open a call's JSON up to its first argument's value."""
    head = '{"name": ' + json.dumps(function["name"]) + ', "arguments": {'
    params = function.get("parameters", {})
    props: dict[str, Any] = params.get("properties", {})
    first = next(iter(params.get("required") or props), None)
    if first is None:
        return head
    quote = '"' if props.get(first, {}).get("type") == "string" else ""
    return f"{head}{json.dumps(first)}: {quote}"


def salvage_forced_call(prefill: str, completion: str) -> list[dict[str, Any]]:
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


class HFChatModel(BaseChatModel):
    """Chat model over a `LocalPolicy` (`HFPolicy`, `BatchingPolicy`): greedy, as an engine.

    A call's token budget is `fixed_max_new_tokens` when set (the CLI's
    `--engine-max-new-tokens`), else the call's `max_tokens` (LangChain's standard name, e.g.
    `.bind(max_tokens=128)`) or `max_new_tokens`, else the `max_new_tokens` field. Its stop
    strings are the `stop` field's plus the call's.

    The reply's `response_metadata` says how the call ended: `finish_reason` is "stop" (EOS,
    a forced tool call's closed JSON, or a stop string, then named by `stop_sequence`),
    "length" (the budget) or "repetition";
    `notes` says the same in words for the node's transition. The text omits the stop string
    and what follows it, as LangChain's `stop` means; `completion_ids` and `logprobs` are every
    generated token, the last of which completes the stop string.

    A call given `choice` (a list of strings, as vLLM's structured outputs name it) replies with
    one of them, the likeliest by the model's scores or sampled at a temperature (`local.choose`);
    nothing is generated, so budget and stop strings do not apply, and tools are an error.
    """

    scores_choices: ClassVar[bool] = True
    """Whether a call may be given `choice` (a served model's scores are not at hand here)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    policy: LocalPolicy = Field(exclude=True)
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    """The budget of a call that names none."""
    fixed_max_new_tokens: int | None = None
    """When set, every call's budget, whatever the call asked for."""
    stop: list[str] | None = None
    """Stop strings of every call, before the call's own."""
    repetition: RepetitionRule | None = Field(default_factory=RepetitionRule)
    """The degenerate-repetition rule that ends a call; None turns it off."""

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

    def budget(self, kwargs: dict[str, Any]) -> int:
        """Return a call's token budget (see the class docstring for the order)."""
        if self.fixed_max_new_tokens is not None:
            return self.fixed_max_new_tokens
        asked = kwargs.get("max_tokens", kwargs.get("max_new_tokens"))
        return int(asked) if asked is not None else self.max_new_tokens

    def _policy_for(self, run_manager: CallbackManagerForLLMRun | None) -> LocalPolicy:
        """Return the policy a call runs on: this model's (a subclass may pick per caller)."""
        return self.policy

    def _on_generation(
        self, run_manager: CallbackManagerForLLMRun | None, chat: Messages, generation: Generation
    ) -> None:
        """Hear of a call's generation and the chat the policy saw (a subclass records it)."""

    def _tokenizer(self) -> Any:
        """Return the tokenizer that decodes this model's completions."""
        return self.policy.handle.tokenizer

    def _stop_ids(self) -> set[int]:
        """Return the token ids that end a completion (EOS)."""
        return self.policy.handle.stop_ids()

    def _watch(self, stop: list[str] | None, chat: Messages) -> StopWatch:
        strings = tuple(s for s in [*(self.stop or []), *(stop or [])] if s)
        tokenizer = self._tokenizer()
        # A forced call's prefill opens its JSON: the reply is done when the JSON closes.
        prefill = chat[-1]["content"] if chat and chat[-1]["role"] == "assistant" else None

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=True))

        return StopWatch(decode, strings, self.repetition, json_prefix=prefill)

    def _prepare(
        self, messages: list[BaseMessage], kwargs: dict[str, Any]
    ) -> tuple[Messages, Sampling, list[dict[str, Any]], str | None]:
        tools: list[dict[str, Any]] = kwargs.get("tools") or []
        choice = kwargs.get("tool_choice")
        if isinstance(choice, dict):
            choice = choice.get("function", {}).get("name")
        chat = tool_call_chat(to_chat_dicts(messages), tools, choice)
        sampling = Sampling(
            temperature=kwargs.get("temperature", self.temperature),
            top_p=kwargs.get("top_p", self.top_p),
            max_new_tokens=self.budget(kwargs),
        )
        return chat, sampling, tools, choice

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        policy = self._policy_for(run_manager)
        if kwargs.get("choice") is not None:
            return self._chosen(policy, to_chat_dicts(messages), kwargs)
        chat, sampling, tools, choice = self._prepare(messages, kwargs)
        watch = self._watch(stop, chat)
        gen = policy.generate(chat, sampling, stopping=watch)
        self._on_generation(run_manager, chat, gen)
        prefill = chat[-1]["content"] if chat[-1]["role"] == "assistant" else ""
        text = prefill + watch.cut(gen.text)
        calls = read_tool_calls(prefill, watch.cut(gen.text), tools, choice)
        message = AIMessage(
            content="" if calls else text,
            tool_calls=calls,
            response_metadata={
                "model": policy.version,
                "prompt_ids": gen.prompt_ids,
                "completion_ids": gen.completion_ids,
                "logprobs": gen.logprobs,
                **self._ending(watch, gen, sampling),
            },
            usage_metadata={
                "input_tokens": len(gen.prompt_ids or []),
                "output_tokens": len(gen.completion_ids or []),
                "total_tokens": len(gen.prompt_ids or []) + len(gen.completion_ids or []),
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def can_choose(self) -> bool:
        """Say whether a call may be given `choice` (`ChoosingModel`)."""
        return self.scores_choices and isinstance(self.policy, ScoringPolicy)

    def _chosen(self, policy: LocalPolicy, chat: Messages, kwargs: dict[str, Any]) -> ChatResult:
        """Reply with one of `kwargs["choice"]` (see the class docstring)."""
        if not (self.scores_choices and isinstance(policy, ScoringPolicy)):
            raise ValueError(f"{type(self).__name__} cannot score a `choice`; call without it")
        if kwargs.get("tools") or kwargs.get("tool_choice"):
            raise ValueError("a call cannot have both `choice` and tools: give one of them")
        temperature = float(kwargs.get("temperature", self.temperature))
        choices = check_choices(kwargs["choice"])
        best, meta = choose(policy, chat, choices, temperature)
        message = AIMessage(content=best, response_metadata={"model": policy.version, **meta})
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _ending(
        self, watch: StopWatch, gen: Generation | None, sampling: Sampling
    ) -> dict[str, Any]:
        """Say how a call ended: `finish_reason`, `stop_sequence` and `notes` (see the class)."""
        notes = list(gen.notes) if gen is not None else []
        early = watch.note()
        if early is not None:
            notes.append(early)
        ending: dict[str, Any] = {"finish_reason": watch.reason}
        if watch.reason == "stop" and watch.detail:
            ending["stop_sequence"] = watch.detail
        elif watch.reason is None and gen is not None:
            ids = gen.completion_ids or []
            ended = bool(ids) and ids[-1] in self._stop_ids()
            full = len(ids) >= sampling.max_new_tokens and not ended
            ending["finish_reason"] = "length" if full else "stop"
            if full:
                notes.append(f"engine budget spent: {sampling.max_new_tokens} tokens")
        elif watch.reason is None:  # a stream: no ids to tell EOS from the budget
            del ending["finish_reason"]
        return {**ending, **({"notes": notes} if notes else {})}

    def _whole_reply(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None,
        run_manager: CallbackManagerForLLMRun | None,
        **kwargs: Any,
    ) -> ChatGenerationChunk:
        """Generate the whole reply and return it as one stream chunk (calls and metadata too)."""
        message = self._generate(messages, stop, run_manager, **kwargs).generations[0].message
        assert isinstance(message, AIMessage)
        return ChatGenerationChunk(
            message=AIMessageChunk(
                content=message.content,
                tool_calls=message.tool_calls,
                response_metadata=message.response_metadata,
            )
        )

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        chat, sampling, tools, _ = self._prepare(messages, kwargs)
        if tools or kwargs.get("choice") is not None:  # known only once whole
            yield self._whole_reply(messages, stop, run_manager, **kwargs)
            return
        watch = self._watch(stop, chat)
        text = sent = ""
        for piece in stream_text(self._policy_for(run_manager), chat, sampling, watch):
            text += piece
            kept = watch.cut(text)
            # Hold back what may begin a stop string: the caller must never see its start.
            ready = (
                kept if len(kept) < len(text) else kept[: len(kept) - held_back(kept, watch.stop)]
            )
            if len(ready) > len(sent):
                yield _chunk(ready[len(sent) :], run_manager)
                sent = ready
        rest = watch.cut(text)[len(sent) :]
        if rest:
            yield _chunk(rest, run_manager)
        ending = self._ending(watch, None, sampling)
        if ending:
            yield ChatGenerationChunk(message=AIMessageChunk(content="", response_metadata=ending))


def _chunk(piece: str, run_manager: CallbackManagerForLLMRun | None) -> ChatGenerationChunk:
    chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
    if run_manager:
        run_manager.on_llm_new_token(piece, chunk=chunk)
    return chunk


class ServerChatModel(HFChatModel):
    """A chat model whose completions come from a `ServerPolicy` that holds the tokenizer.

    Greedy by default, as an engine. It streams as one chunk: the server's reply is read whole,
    then cut by the call's watch, so nothing past a stop is ever shown.
    """

    policy: ServerPolicy = Field(exclude=True)  # type: ignore[assignment]
    scores_choices: ClassVar[bool] = False
    """A `choice` call is refused, so the verifier's follow-up is written (`verifier`), not chosen
    as a local engine's is. vLLM could score choices (`prompt_logprobs`) or constrain to them
    (structured outputs' `choice`); not done: no vLLM here to check its replies against."""

    def model_post_init(self, context: Any, /) -> None:
        """Refuse a server policy without the model's tokenizer.

        Raises:
            ValueError: no tokenizer: prompts could not be rendered nor replies watched here.

        """
        super().model_post_init(context)
        if self.policy.tokenizer is None:
            raise ValueError(
                f"the engine on {self.policy.url} needs its model's tokenizer here, to render "
                "its chat template and watch its replies: give ServerPolicy(tokenizer=...)"
            )

    @property
    def _llm_type(self) -> str:
        return "flowlearn-server"

    def _tokenizer(self) -> Any:
        return self.policy.tokenizer

    def _stop_ids(self) -> set[int]:
        eos = self.policy.tokenizer.eos_token_id
        return set(eos if isinstance(eos, list) else [eos])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        chunk = self._whole_reply(messages, stop, run_manager, **kwargs)
        if run_manager and chunk.text:
            run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk
