"""The planner: a query analysis on its first visit (if the run asks), then a decision per turn."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from langchain_core.tools import BaseTool
from langgraph.types import Overwrite, RetryPolicy

from flowlearn.engine.protocol import Policy, continues_prefill, local_tokenizer
from flowlearn.engine.sampling import Generation, Sampling, calls_until
from flowlearn.engine.stops import RepetitionRule, StopWatch
from flowlearn.nodes.catalogue import enabled_tools, render_catalogue
from flowlearn.nodes.engine_calls import role_call
from flowlearn.nodes.parsing import match_tool_name, parse_planner_output, starts_with_label
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts, runs_analysis
from flowlearn.nodes.render import (
    emit,
    policy_transition,
    prompt_messages,
    render_memory,
    run_deadline,
    summarize,
    transition,
)
from flowlearn.nodes.retry import ENGINE_RETRY, engine_error, retrying
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import ParseStatus
from flowlearn.nodes.schema.state import State

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.runtime import Runtime


def render_plan_examples(tools: Sequence[BaseTool], prompts: Prompts = AGENTFLOW_PROMPTS) -> str:
    """Render a worked plan for each tool that has one, for the planner's `{examples}`.

    A tool's plan comes from `prompts.plan_examples[name]`, else its own
    `metadata["plan_example"]` (justification, context, sub_goal). The example names its tool,
    so a planner sees what a step with each enabled tool looks like. Returns "" when no tool
    has one, or the block that ends the planner prompt.
    """
    examples = []
    for tool in tools:
        example = prompts.plan_examples.get(tool.name) or (tool.metadata or {}).get("plan_example")
        if example:
            examples.append(prompts.plan_example.format(tool=tool.name, **example))
    if not examples:
        return ""
    head = "\nFor example:\n" if len(examples) == 1 else "\nFor example, one step per tool:\n"
    return head + "\n\n".join(examples)


def with_reply_prefix(text: str, prefix: str | None) -> str:
    """Return the plan's full text: the prefilled first label, then what the policy wrote.

    A policy that wrote a label itself (a chat API that ignores the prefill, a scripted
    policy, a planner trained on another field order) or answered in JSON is taken as it is.
    """
    head = text.lstrip()
    if not prefix or starts_with_label(head) or head.startswith(("{", "```")):
        return text
    return prefix + text


def plan_complete(text: str, prefix: str | None = None) -> bool:
    """Say whether a plan is complete: a sub-goal and a tool name, at the end of a line.

    The policy stops there instead of writing more plans after it.
    """
    if not text.endswith("\n"):
        return False
    return parse_planner_output(with_reply_prefix(text, prefix)).error is None


def plan_stop(policy: Policy, prefix: str | None = None) -> dict[str, Any]:
    """Return the `stopping` keyword for a local policy's call (`{}` for other policies).

    A local model's plan ends at the end of its tool-name line (`plan_complete`), or at a
    degenerate repetition. Stopping changes no logit, so the logged logprobs stay those of the
    sampled tokens; server and chat-model policies end at their own EOS or budget.
    """
    tokenizer = local_tokenizer(policy)
    if tokenizer is None:
        return {}

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=True))

    def ends(text: str) -> bool:
        return plan_complete(text, prefix)

    return {"stopping": StopWatch(decode=decode, ends=ends, repetition=RepetitionRule())}


RUN_FIELDS: dict[str, Any] = {
    "analysis": "",
    "plan": None,
    "final_text": "",
    "answer": "",
    "seconds": 0.0,
    "termination": None,
}
"""What one run writes besides memory, transitions and turns, as a fresh run starts it."""


def starting_anew(update: dict[str, Any]) -> dict[str, Any]:
    """Return the first turn's update of a new run on a thread that holds a finished one.

    A thread keeps one run at a time in its state (the checkpointer keeps the earlier runs in
    its history): the new question's run starts from empty memory and transitions and turn 1,
    as on a fresh thread, instead of inheriting the last run's work. `Overwrite` replaces the
    appended lists rather than adding to them.
    """
    fresh = {**RUN_FIELDS, **update}
    fresh["memory"] = Overwrite(update.get("memory", []))
    fresh["transitions"] = Overwrite(update.get("transitions", []))
    return fresh


def spent_budget(state: State, context: Context, now: float) -> str | None:
    """Return why the budget is spent ("max_seconds" or "max_turns"), or None.

    Time first: a run past its seconds says so, even when its turns are spent too.
    """
    started = state.get("started_at")
    limit = context.max_seconds
    if limit is not None and started is not None and now - started >= limit:
        return "max_seconds"
    if state.get("turn", 0) >= context.max_turns:
        return "max_turns"
    return None


POLICY = "the planner's policy"
"""What a failed policy call's recorded error names as the caller."""


def failed_decision(
    update: dict[str, Any],
    turn: int,
    messages: list[dict[str, str]],
    exc: Exception,
    seconds: float,
    runtime: Any,
) -> dict[str, Any]:
    """Record a policy call that failed (retries spent) and end the run on `engine_error`.

    The error (redacted, `nodes.retry.engine_error`) goes into the turn's transition and a
    memory record, so the answer is still written from what the run found and the trajectory
    says why it stopped; the transition carries no tokens, so training leaves it out.
    """
    error = engine_error(exc, POLICY)
    update["turn"] = turn
    update["plan"] = None
    update["termination"] = "engine_error"
    update["transitions"].append(transition("planner", turn, messages, error, "error", seconds))
    update["memory"] = [{"turn": turn, "kind": "format_error", "error": error, "result": ""}]
    emit(runtime, {"event": "planner", "turn": turn, "ok": False, "error": error})
    return update


def plan_messages(
    state: State,
    context: Context,
    available: Sequence[BaseTool],
    *,
    analysis: str | None,
    tools: str,
    turn: int,
    prefill: bool,
    prompts: Prompts = AGENTFLOW_PROMPTS,
) -> list[dict[str, str]]:
    """Render the prompt for `turn`: reply opened if `prefill`, analysis section if given."""
    template = prompts.template("planner", analysis=analysis is not None)
    messages = prompt_messages(
        template.format(
            question=state["question"],
            analysis=analysis or "",
            tools=tools,
            memory=render_memory(state.get("memory", [])),
            turn=turn,
            max_turns=context.max_turns,
            tool_names=", ".join(tool.name for tool in available),
            examples=render_plan_examples(available, prompts),
        ),
        system=prompts.system,
    )
    if prefill and prompts.planner_reply_prefix:  # the policy writes the rest of the reply
        messages.append({"role": "assistant", "content": prompts.planner_reply_prefix})
    return messages


def analysis_messages(
    question: str, available: Sequence[BaseTool], prompts: Prompts = AGENTFLOW_PROMPTS
) -> list[dict[str, str]]:
    """Render the query analysis's prompt: the question and the tool catalogue."""
    catalogue = render_catalogue(available, brief=prompts.brief_analysis_catalogue)
    return prompt_messages(
        prompts.query_analysis.format(question=question, tools=catalogue), system=prompts.system
    )


def record_decision(
    update: dict[str, Any],
    turn: int,
    messages: list[dict[str, str]],
    gen: Generation,
    available: Sequence[BaseTool],
    runtime: Any,
    prefilled: str | None = None,
) -> dict[str, Any]:
    """Parse the policy's output (after the `prefilled` label, if any) into the turn's plan.

    An output that does not parse is recorded in memory as a format error instead.
    """
    decision = parse_planner_output(with_reply_prefix(gen.text, prefilled))
    tool = match_tool_name(decision.tool_name, [t.name for t in available])
    error = decision.error
    status: ParseStatus = "ok" if error is None else "format_error"
    if error is None and tool is None:
        error = (
            f"tool {decision.tool_name!r} is not available; "
            f"choose one of {[t.name for t in available]}"
        )
        status = "unknown_tool"
    update["turn"] = turn
    update["transitions"].append(policy_transition("planner", turn, messages, gen, status))
    if error is not None or tool is None:
        update["plan"] = None
        update["memory"] = [
            {"turn": turn, "kind": "format_error", "error": error, "result": gen.text[:500]}
        ]
        emit(runtime, {"event": "planner", "turn": turn, "ok": False, "error": error})
        return update
    update["plan"] = {
        "turn": turn,
        "justification": decision.justification,
        "context": decision.context,
        "sub_goal": decision.sub_goal,
        "tool": tool,
    }
    emit(
        runtime,
        {
            "event": "planner",
            "turn": turn,
            "ok": True,
            "sub_goal": summarize(decision.sub_goal),
            "tool": tool,
        },
    )
    return update


def analyzer(
    generate: Callable[..., Generation], ask: Callable[..., Any] | None, prompts: Prompts
) -> Callable[[str, Sequence[BaseTool], Sampling], tuple[str, dict[str, Any]]]:
    """Return the first visit's query analysis: the engine's (`ask`) if given, else the policy's.

    Either way a failed call is recorded (its transition says why) and the run goes on
    without the analysis.
    """

    def analyze(
        question: str, available: Sequence[BaseTool], sampling: Sampling
    ) -> tuple[str, dict[str, Any]]:
        messages = analysis_messages(question, available, prompts)
        if ask is not None:
            reply = ask(messages)
            if reply.error is not None:
                record = transition(
                    "query_analysis", 0, messages, reply.error, "error", reply.seconds
                )
                return f"(no query analysis: {reply.error})", dict(record)
            record = transition(
                "query_analysis", 0, messages, reply.text, "ok", reply.seconds, **reply.record()
            )
            return reply.text, dict(record)
        start = time.perf_counter()
        try:
            gen = generate(messages, sampling.for_call(question, 0))
        except Exception as exc:  # retries spent: recorded as an engine analysis's is
            error = engine_error(exc, POLICY)
            seconds = time.perf_counter() - start
            record = transition("query_analysis", 0, messages, error, "error", seconds)
            return f"(no query analysis: {error})", dict(record)
        return gen.text, dict(policy_transition("query_analysis", 0, messages, gen))

    return analyze


def make_planner(
    policy: Policy,
    tools: Sequence[BaseTool],
    *,
    analysis_engine: BaseChatModel | None = None,
    prompts: Prompts = AGENTFLOW_PROMPTS,
    retry: RetryPolicy | None = ENGINE_RETRY,
) -> Callable[..., dict[str, Any]]:
    """Build the planner node over a policy and the tools it may choose from.

    Args:
        policy: The trainable policy that writes each turn's decision.
        tools: The tools bound to the graph; `Context.tools` may enable a subset per run.
        analysis_engine: A chat model for the first-visit query analysis, as in the paper
            (the fixed engine); when None the policy writes the analysis too. Either runs
            when the run's `Context.query_analysis` is on, or is None and `prompts.analyze`.
        prompts: The planner's and query analysis's templates, worked plans, reply prefix and
            analysis budget.
        retry: How transient errors of the engine's and the policy's calls are retried (None:
            never). A failed analysis is recorded and the run goes on; a policy decision that
            still fails is recorded (transition and memory) and ends the run on
            `engine_error`, its answer written from the memory so far. A policy's calls end
            by the run's `max_seconds` (`Sampling.deadline`; a served policy honours it).

    """
    tools = list(tools)
    generate = retrying(policy.generate, retry)
    prefix = prompts.planner_reply_prefix if continues_prefill(policy) else None
    ask = None
    if analysis_engine is not None:
        ask = role_call(analysis_engine, retry, max_tokens=prompts.budgets.query_analysis)

    analyze = analyzer(generate, ask, prompts)

    def planner(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        if state.get("termination") is not None:  # a finished run: this question starts anew
            return starting_anew(plan_turn({"question": state["question"]}, runtime))
        return plan_turn(state, runtime)

    def plan_turn(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        context = runtime.context or Context()
        context.check_question(state.get("question", ""))  # text, not blank, not too long
        now = time.time()
        started = state.get("started_at", now)
        reason = spent_budget({**state, "started_at": started}, context, now)
        if reason is not None:
            emit(runtime, {"event": "budget", "turn": state.get("turn", 0), "reason": reason})
            return {"termination": reason, "plan": None}

        available = enabled_tools(tools, context.tools)
        catalogue = render_catalogue(available)
        deadline = run_deadline({**state, "started_at": started}, context)
        sampling = replace(context.planner_sampling(), deadline=deadline)
        update: dict[str, Any] = {"started_at": started, "transitions": []}
        analyzing = runs_analysis(context, prompts)
        analysis = state.get("analysis") if analyzing else None
        if analyzing and not analysis:
            with calls_until(deadline):  # the engine's analysis ends with the run's budget too
                analysis, record = analyze(state["question"], available, sampling)
            update["analysis"] = analysis
            update["transitions"].append(record)

        turn = state.get("turn", 0) + 1
        messages = plan_messages(
            state,
            context,
            available,
            analysis=analysis,
            tools=catalogue,
            turn=turn,
            prefill=prefix is not None,
            prompts=prompts,
        )
        # a fresh watch per call: it keeps the state of the one generation it watches
        stopping = plan_stop(policy, prefix)
        start = time.perf_counter()
        try:
            gen = generate(messages, sampling.for_call(state["question"], turn), **stopping)
        except Exception as exc:  # retries spent, or not worth one: recorded, the run ends
            seconds = time.perf_counter() - start
            return failed_decision(update, turn, messages, exc, seconds, runtime)
        return record_decision(update, turn, messages, gen, available, runtime, prefix)

    return planner
