"""The executor: the fixed engine fills in the tool's arguments, then the tool runs.

A trained executor (`policy` given: its own LoRA adapter, `flowlearn.engine.adapters`) writes
the call itself, in the local chat model's JSON tool-call convention (the same instructions and
prefilled opening the engine is given, `engine.chat.tool_call_chat`), so its adapter starts
from what the engine would write; the call's exact tokens are recorded and trained on. It
samples at the run's planner temperature (training scores every trained node's tokens at TRL's
one temperature), with its own top-p and token budget.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from langchain_core.messages import AIMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.types import RetryPolicy

from flowlearn.engine.chat import read_tool_calls, to_langchain, tool_call_chat
from flowlearn.engine.protocol import Policy, continues_prefill, policy_tokenizer
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.stops import RepetitionRule, StopWatch
from flowlearn.nodes.catalogue import describe_tool, tool_arguments
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, MemoryView, Prompts
from flowlearn.nodes.render import (
    bare_question,
    emit,
    policy_transition,
    prompt_messages,
    summarize,
    transition,
    truncate,
    within_run_budget,
)
from flowlearn.nodes.retry import ENGINE_RETRY, engine_error, retrying
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import ParseStatus, StepRecord, Transition
from flowlearn.nodes.schema.state import State
from flowlearn.nodes.tool_review import review
from flowlearn.secrets import error_text, redact

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.runtime import Runtime

_JSON_DECODER = json.JSONDecoder()
REDACT_MARGIN = 4096
"""Characters past a result's cut that are still redacted: more than any key, header or URL
credential `redact` looks for, so one that starts before the cut is found whole."""


def _first_json_object(text: str) -> dict[str, Any] | None:
    """Return the first JSON object embedded in `text`, or None."""
    for start, char in enumerate(text):
        if char != "{":
            continue
        try:
            value, _ = _JSON_DECODER.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def _single_argument_fallback(tool: BaseTool, text: str) -> dict[str, Any] | None:
    """Use the model's plain text as the argument of a tool that takes one string."""
    args = tool.args
    if len(args) == 1:
        ((name, spec),) = args.items()
        if spec.get("type", "string") == "string" and text.strip():
            return {name: text.strip()}
    return None


def call_example_turns(
    tool: BaseTool, prompts: Prompts = AGENTFLOW_PROMPTS
) -> list[dict[str, str]]:
    """Return the tool's worked calls as earlier chat turn pairs, in their order.

    A tool carries them in `metadata["call_examples"]` (a list) or one in
    `metadata["call_example"]`, and `prompts.call_examples[name]` adds more after them; each is
    a question, context, sub-goal and the arguments wanted. Each is rendered by the executor's
    own prompt, and its reply is the call in the engine's JSON convention, as plain text, so any
    chat model can read it. None: no turns.
    """
    metadata = tool.metadata or {}
    if "call_example" in metadata and "call_examples" in metadata:
        raise ValueError(
            f"tool {tool.name!r} has both metadata['call_example'] and ['call_examples']; "
            "keep one (a list of worked calls goes in 'call_examples')"
        )
    examples = metadata.get("call_examples") or [metadata.get("call_example")]
    examples = [
        *(example for example in examples if example),
        *prompts.call_examples.get(tool.name, ()),
    ]
    if not all(isinstance(example, dict) for example in examples):
        raise ValueError(
            f"tool {tool.name!r}: metadata['call_examples'] must be a list of dicts with "
            "'question', 'context', 'sub_goal' and 'arguments'"
        )
    turns: list[dict[str, str]] = []
    for example in examples:
        user = prompts.executor.format(
            tool=tool.name,
            question=example["question"],
            context=example["context"],
            sub_goal=example["sub_goal"],
            tool_description=describe_tool(tool),
        )
        arguments = example["arguments"]
        call = json.dumps({"name": tool.name, "arguments": arguments}, ensure_ascii=False)
        turns += [{"role": "user", "content": user}, {"role": "assistant", "content": call}]
    return turns


def call_with_timeout(tool: BaseTool, arguments: dict[str, Any], seconds: float) -> Any:
    """Run the tool on a worker thread; stop waiting after `seconds` with a `TimeoutError`.

    A hung tool's thread cannot be killed from Python; it is left behind (as a daemon) while
    the flow records the timeout and moves on.
    """
    done: Future[Any] = Future()

    def work() -> None:
        try:
            done.set_result(tool.invoke(arguments))
        except BaseException as exc:
            done.set_exception(exc)

    context = contextvars.copy_context()  # the tool still sees LangGraph's run config
    threading.Thread(
        target=context.run, args=(work,), name=f"tool-{tool.name}", daemon=True
    ).start()
    try:
        return done.result(timeout=seconds)
    except FutureTimeout:
        raise TimeoutError(
            f"{tool.name} did not finish within {seconds:g} s (Context.tool_timeout_s)"
        ) from None


def propose_arguments(
    engine: BaseChatModel,
    tool: BaseTool,
    messages: list[dict[str, str]],
    prompts: Prompts = AGENTFLOW_PROMPTS,
) -> tuple[dict[str, Any] | None, str, ParseStatus]:
    """Ask the engine for the tool's arguments, by tool calling when it can, else by JSON.

    Returns the arguments (None when none could be read), the raw output and a parse status.
    Generated text is only ever parsed as data, never executed.
    """
    budget = prompts.budgets.executor
    try:
        bound = engine.bind_tools([tool], tool_choice=tool.name, max_tokens=budget)
    except (NotImplementedError, TypeError, ValueError):
        bound = None
    if bound is not None:
        reply = bound.invoke(to_langchain(messages))
        calls = reply.tool_calls if isinstance(reply, AIMessage) else []
        for call in calls:
            if call["name"] == tool.name:
                return dict(call["args"]), json.dumps(call, default=str), "ok"
        text = reply.text
    else:
        schema = json.dumps(tool_arguments(tool), ensure_ascii=False)
        ask = prompts.executor_json_fallback.format(tool=tool.name, schema=schema)
        fallback = [*messages, {"role": "user", "content": ask}]
        text = engine.invoke(to_langchain(fallback), max_tokens=budget).text
    arguments = _first_json_object(text) or _single_argument_fallback(tool, text)
    return arguments, text, "ok" if arguments is not None else "format_error"


def run_tool(
    record: StepRecord,
    tool: BaseTool,
    arguments: dict[str, Any] | None,
    rejected: bool,
    proposal: tuple[ParseStatus, str],
    context: Context,
) -> None:
    """Run the tool on the proposed arguments and write the result or error into `record`.

    Both are redacted (`flowlearn.secrets`) before they reach memory: a tool can echo a key in
    a successful answer (a search hit quoting its request URL, code printing the environment)
    as easily as in an error.
    """
    status, raw = proposal
    start = time.perf_counter()
    if rejected:
        record["error"] = "the tool call was rejected by the reviewer"
    elif arguments is None:
        record["error"] = (
            raw
            if status == "error"
            else f"the executor wrote no usable arguments for {tool.name}: {raw[:200]!r}"
        )
    else:
        try:
            result = call_with_timeout(tool, arguments, context.tool_timeout_s)
            text, limit = _as_text(result), context.max_result_chars
            # cut before redacting, so a huge result costs no more than a kept one; the margin
            # keeps a key that starts before the cut whole for `redact` to find
            kept = redact(text[: limit + REDACT_MARGIN])
            record["result"] = truncate(kept, limit, length=len(text))
        except Exception as exc:  # a tool failure is data for the planner, not a crash
            record["error"] = truncate(error_text(exc), context.max_result_chars)  # no secrets
    record["seconds"] = round(time.perf_counter() - start, 6)


def write_call(
    write: Callable[..., tuple[dict[str, Any] | None, str, ParseStatus, Transition]] | None,
    propose: Callable[..., tuple[dict[str, Any] | None, str, ParseStatus]],
    engine: Any,
    tool: BaseTool,
    messages: Messages,
    prompts: Prompts,
    context: Context,
    question: str,
    turn: int,
) -> tuple[dict[str, Any] | None, str, ParseStatus, Transition]:
    """Have the trained policy (`write`) or the engine (`propose`, retried) write the tool call.

    A call that still fails (retries spent, or not worth one) is recorded as the turn's error
    and the run goes on; a failed policy call carries no tokens, so training leaves it out.
    """
    start = time.perf_counter()
    caller = "the engine" if write is None else "the executor's policy"
    try:
        if write is not None:
            return write(tool, messages, context, question, turn)
        arguments, raw, status = propose(engine, tool, messages, prompts)
    except Exception as exc:
        arguments, status, raw = None, "error", engine_error(exc, caller)
    made = transition("executor", turn, messages, raw, status, time.perf_counter() - start)
    return arguments, raw, status, made


def make_executor(
    engine: BaseChatModel,
    tools: Sequence[BaseTool],
    *,
    prompts: Prompts = AGENTFLOW_PROMPTS,
    retry: RetryPolicy | None = ENGINE_RETRY,
    policy: Policy | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
) -> Callable[..., dict[str, Any]]:
    """Build the executor node over the fixed engine (or its own trained policy) and the tools.

    Args:
        engine: The fixed chat model that fills in each call's arguments.
        tools: The tools the planner may choose from.
        prompts: The executor's templates, worked calls and budget.
        retry: How the argument proposal is retried (None: never); tool calls are never
            retried.
        policy: A trained executor's policy (token-faithful, e.g. an `AdapterPolicy`): it
            writes each call and records its tokens; None: the engine writes them.
        top_p: The trained executor's top-p; None: the run's planner top-p.
        max_new_tokens: The trained executor's budget; None: the prompt set's executor budget.

    """
    by_name = {tool.name: tool for tool in tools}
    propose = retrying(propose_arguments, retry)
    write = (
        trained_proposal(policy, retry, top_p, max_new_tokens or prompts.budgets.executor)
        if policy is not None
        else None
    )

    def executor(state: State, runtime: Runtime[Context]) -> dict[str, Any]:

        context = runtime.context or Context()
        plan = state.get("plan")
        if plan is None:
            raise ValueError(
                "executor reached without a plan; route to it only after a parsed turn"
            )
        tool = by_name[plan["tool"]]
        question = str(state["question"])
        messages = prompt_messages(
            prompts.executor.format(
                tool=tool.name,
                question=bare_question(question)
                if prompts.executor_view.bare_question
                else question,
                context=executor_context(plan["context"], state, prompts.executor_view),
                sub_goal=plan["sub_goal"],
                tool_description=describe_tool(tool),
            ),
            system=prompts.system,
        )
        messages[1:1] = call_example_turns(tool, prompts)  # after the system prompt
        arguments, raw, status, made = write_call(
            write, propose, engine, tool, messages, prompts, context, question, plan["turn"]
        )
        record: StepRecord = {
            "turn": plan["turn"],
            "kind": "action",
            "sub_goal": plan["sub_goal"],
            "context": plan["context"],
            "tool": tool.name,
            "arguments": arguments,
            "result": None,
            "error": None,
        }
        rejected = False
        if arguments is not None and context.approve_tools:
            reviewed = review(plan["turn"], tool, plan["sub_goal"], arguments)
            rejected = reviewed is None
            record["arguments"] = arguments = arguments if reviewed is None else reviewed
        run_tool(record, tool, arguments, rejected, (status, raw), context)
        emit(
            runtime,
            {
                "event": "tool",
                "turn": plan["turn"],
                "tool": tool.name,
                "arguments": arguments,
                "ok": record["error"] is None,
                "summary": summarize(record["error"] or record["result"] or ""),
            },
        )
        return {"memory": [record], "transitions": [made]}

    return within_run_budget(executor)


Proposal = Callable[
    [BaseTool, Messages, Context, str, int],
    tuple[dict[str, Any] | None, str, ParseStatus, Transition],
]
"""A trained executor's call: the tool, the executor's messages, the run's context, the question
and the turn; the arguments read (None: none), the reply, its parse status and its transition."""


def trained_proposal(
    policy: Policy, retry: RetryPolicy | None, top_p: float | None, budget: int
) -> Proposal:
    """Return the trained executor's call: the policy writes the tool call, token-exact.

    The chat is the engine's for a forced call (`tool_call_chat`); a policy that cannot
    continue a reply gets no prefilled opening. A policy with a tokenizer (local or served)
    stops once the call's JSON closes (`StopWatch`, a fresh one per attempt), as the engine
    does. A call the human reviews (`Context.approve_tools`) is sampled with a seed (the run's,
    else 0), since the node runs again when the run resumes and must propose the call reviewed.
    """
    prefills = continues_prefill(policy)
    tokenizer = policy_tokenizer(policy)

    def attempt(chat: Messages, sampling: Sampling, prefill: str) -> Generation:
        if tokenizer is None:
            return policy.generate(chat, sampling)

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=True))

        watch = StopWatch(decode, (), RepetitionRule(), json_prefix=prefill)
        return policy.generate(chat, sampling, stopping=watch)  # type: ignore[call-arg]

    generate = retrying(attempt, retry)

    def propose(
        tool: BaseTool, messages: Messages, context: Context, question: str, turn: int
    ) -> tuple[dict[str, Any] | None, str, ParseStatus, Transition]:
        schema = convert_to_openai_tool(tool)
        chat = tool_call_chat(messages, [schema], tool.name, prefill=prefills)
        prefill = chat[-1]["content"] if chat[-1]["role"] == "assistant" else ""
        sampling = dataclasses.replace(context.planner_sampling(), max_new_tokens=budget)
        if top_p is not None:
            sampling = dataclasses.replace(sampling, top_p=top_p)
        if context.approve_tools and sampling.seed is None:
            sampling = dataclasses.replace(sampling, seed=0)
        gen = generate(chat, sampling.for_call(question, turn, "executor"), prefill)
        calls = read_tool_calls(prefill, gen.text, [schema], tool.name)
        arguments = next((dict(c["args"]) for c in calls if c["name"] == tool.name), None)
        status: ParseStatus = "ok" if arguments is not None else "format_error"
        raw = json.dumps(calls[0], default=str) if arguments is not None else prefill + gen.text
        return arguments, raw, status, policy_transition("executor", turn, chat, gen, status)

    return propose


def executor_context(context: str, state: State, view: MemoryView) -> str:
    """Return the plan's context, then the earlier calls' results when `view.results` is on."""
    results = [
        str(record["result"])
        for record in state.get("memory", [])
        if view.results and record["kind"] == "action" and record.get("result")
    ]
    return "\n".join([context, *results]) if results else context


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    content = getattr(result, "content", None)  # a ToolMessage
    if isinstance(content, str):
        return content
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)
