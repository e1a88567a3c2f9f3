"""The verifier: judges whether memory answers the question, and stores its verdict.

A reply with no clear `Conclusion:` line is continued once: a second engine call sees the
reply so far and the label `Conclusion:` (`Prompts.verifier_conclusion`), and its word is the
verdict. When the prompts name `verdict_choices` and the engine can score them
(`ChoosingModel`: the local models), it chooses among them there; another writes a few words,
read as before. Both calls are recorded as verifier transitions of the turn; an engine that
concludes on its own is called once. Anything still unclear means CONTINUE, as in AgentFlow.

A trained verifier (`policy` given: its own LoRA adapter, `flowlearn.engine.adapters`) makes the
same two calls through that policy instead, so their exact tokens are recorded and trained on;
its follow-up is written, never chosen, since a forced choice is not text the policy sampled.
It samples at the run's planner temperature (training scores every trained node's tokens at
TRL's one temperature), with its own top-p and token budget.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.tools import BaseTool
from langgraph.types import RetryPolicy

from flowlearn.engine.protocol import Policy, can_choose, continues_prefill, local_tokenizer
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.engine.stops import RepetitionRule, StopWatch, cut_at_stop
from flowlearn.nodes.catalogue import enabled_tools, render_catalogue
from flowlearn.nodes.engine_calls import EngineReply, RoleCall, role_call
from flowlearn.nodes.parsing import parse_verdict
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts, runs_analysis
from flowlearn.nodes.render import (
    emit,
    memory_prompt,
    policy_transition,
    transition,
    within_run_budget,
)
from flowlearn.nodes.retry import ENGINE_RETRY, engine_error, retrying
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import ParseStatus, Transition
from flowlearn.nodes.schema.state import State

if TYPE_CHECKING:
    from langchain_core.language_models import BaseChatModel
    from langgraph.runtime import Runtime


def _record(
    turn: int, messages: Messages, reply: EngineReply, text: str, clear: bool
) -> Transition:
    status: ParseStatus = "error" if reply.error else "ok" if clear else "unclear"
    return transition("verifier", turn, messages, text, status, reply.seconds, **reply.record())


def _concluded(
    conclude: RoleCall, messages: Messages, analysis: str, label: str
) -> tuple[Messages, EngineReply, str]:
    """Continue `analysis` after its `Conclusion:` label; return the chat, reply and whole text.

    A local chat model writing its follow-up continues the final assistant message and returns
    it with the label (`HFChatModel`); one choosing returns only its choice, and another chat
    model replies anew: their replies are read after the label.
    """
    opened = f"{analysis.rstrip()}\n{label}"
    chat = [*messages, {"role": "assistant", "content": opened}]
    reply = conclude(chat)
    tail = reply.text[len(opened) :] if reply.text.startswith(opened) else reply.text
    return chat, reply, f"{opened} {tail.strip()}"


PolicyAsk = Callable[[Messages, Sampling, str], Generation]
"""A trained verifier's call: messages, the run's sampling, and a stop string ("" for none)."""


def policy_ask(policy: Policy, retry: RetryPolicy | None) -> PolicyAsk:
    """Return the trained verifier's call: `policy.generate`, ended at a stop string if given.

    A local policy stops decoding at the stop string (`StopWatch`, a fresh one per attempt);
    the text is cut there either way, while the recorded tokens are every token sampled.
    """
    tokenizer = local_tokenizer(policy)

    def attempt(messages: Messages, sampling: Sampling, stop: str) -> Generation:
        if not stop or tokenizer is None:
            return policy.generate(messages, sampling)

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=True))

        watch = StopWatch(decode, (stop,), RepetitionRule())
        return policy.generate(messages, sampling, stopping=watch)  # type: ignore[call-arg]

    generate = retrying(attempt, retry)

    def call(messages: Messages, sampling: Sampling, stop: str) -> Generation:
        gen = generate(messages, sampling, stop)
        return dataclasses.replace(gen, text=cut_at_stop(gen.text, [stop] if stop else []))

    return call


def make_verifier(
    engine: BaseChatModel,
    tools: Sequence[BaseTool] = (),
    *,
    prompts: Prompts = AGENTFLOW_PROMPTS,
    retry: RetryPolicy | None = ENGINE_RETRY,
    policy: Policy | None = None,
    top_p: float | None = None,
    max_new_tokens: int | None = None,
) -> Callable[..., dict[str, Any]]:
    """Build the verifier node over the fixed engine, or over its own trained policy.

    Args:
        engine: The fixed chat model that judges the memory.
        tools: The tools bound to the graph, shown in its prompt (`Context.tools` may enable a
            subset per run).
        prompts: The template, conclusion label, verdict choices and budgets it uses.
        retry: How its transient engine errors are retried (None: never).
        policy: A trained verifier's policy (token-faithful, e.g. an `AdapterPolicy`): the
            verifier's calls go through it and record their tokens; None: the engine judges.
        top_p: The trained verifier's top-p; None: the run's planner top-p.
        max_new_tokens: The trained verifier's budget; None: the prompt set's verifier budget.

    """
    tools = list(tools)
    budgets = prompts.budgets
    if policy is not None:
        return trained_verifier(
            policy, tools, prompts, retry, top_p, max_new_tokens or budgets.verifier
        )
    ask = role_call(engine, retry, max_tokens=budgets.verifier)
    if prompts.verdict_choices and can_choose(engine):
        conclude = role_call(engine, retry, choice=prompts.verdict_choices)
    else:
        conclude = role_call(engine, retry, max_tokens=budgets.verifier_conclusion, stop=["\n"])

    def verifier(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        turn = state.get("turn", 0)
        context = runtime.context or Context()
        messages = verifier_messages(state, context, tools, prompts)
        reply = ask(messages)
        text, error = reply.text, reply.error
        verdict, clear = parse_verdict(text)
        records = [_record(turn, messages, reply, error or text, clear)]
        if error is not None:  # no judgement to be had: go on to the answer
            text, verdict, clear = error, "STOP", False
        elif not clear:
            chat, second, whole = _concluded(conclude, messages, text, prompts.verifier_conclusion)
            concluded, said = parse_verdict(whole)
            if second.error is None and said:
                verdict, clear, text = concluded, True, whole
            records.append(_record(turn, chat, second, second.error or whole, clear))
        return verdict_update(runtime, turn, text, verdict, clear, records, error=error)

    return within_run_budget(verifier)


def verdict_update(
    runtime: Any,
    turn: int,
    text: str,
    verdict: str,
    clear: bool,
    records: list[Transition],
    *,
    error: str | None,
) -> dict[str, Any]:
    """Return the verifier's state update: the verdict, its memory record and transitions."""
    update: dict[str, Any] = {
        "verdict": verdict,
        "memory": [{"turn": turn, "kind": "verification", "analysis": text, "verdict": verdict}],
        "transitions": records,
    }
    emit(runtime, {"event": "verdict", "turn": turn, "verdict": verdict, "clear": clear})
    if verdict == "STOP":
        update["termination"] = "engine_error" if error else "verifier_stop"
    return update


def verifier_messages(
    state: State, context: Context, tools: Sequence[BaseTool], prompts: Prompts
) -> Messages:
    """Render the verifier's prompt: the question, memory and (if shown) the tool catalogue."""
    template = prompts.template("verifier", analysis=runs_analysis(context, prompts))
    shows_tools = tools and "{tools}" in template
    catalogue = render_catalogue(enabled_tools(tools, context.tools)) if shows_tools else ""
    return memory_prompt(template, state, system=prompts.system, tools=catalogue)


def trained_verifier(
    policy: Policy,
    tools: Sequence[BaseTool],
    prompts: Prompts,
    retry: RetryPolicy | None,
    top_p: float | None,
    budget: int,
) -> Callable[..., dict[str, Any]]:
    """Build the verifier over its own policy: both calls sampled and recorded token-exact.

    A policy call that still fails after the retries is recorded, as the planner's is: its
    transition (no tokens, so training leaves it out) names the error and the run ends on
    `engine_error`, its answer written from the memory so far.
    """
    ask = policy_ask(policy, retry)
    label = prompts.verifier_conclusion
    prefills = continues_prefill(policy)

    def verifier(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        start = time.perf_counter()
        try:
            return judge(state, runtime)
        except Exception as exc:  # retries spent, or not worth one
            turn = state.get("turn", 0)
            context = runtime.context or Context()
            messages = verifier_messages(state, context, tools, prompts)
            error = engine_error(exc, "the verifier's policy")
            seconds = time.perf_counter() - start
            record = transition("verifier", turn, messages, error, "error", seconds)
            return verdict_update(runtime, turn, "", "STOP", False, [record], error=error)

    def judge(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        turn = state.get("turn", 0)
        context = runtime.context or Context()
        sampling = context.planner_sampling()
        if top_p is not None:
            sampling = dataclasses.replace(sampling, top_p=top_p)
        messages = verifier_messages(state, context, tools, prompts)
        asked = dataclasses.replace(sampling, max_new_tokens=budget)
        first = ask(messages, asked.for_call(state["question"], turn, "verifier"), "")
        text = first.text
        verdict, clear = parse_verdict(text)
        status: ParseStatus = "ok" if clear else "unclear"
        records = [policy_transition("verifier", turn, messages, first, status)]
        if not clear:  # the verdict is written after the label, by the same policy
            opened = f"{text.rstrip()}\n{label}"
            chat = [*messages, {"role": "assistant", "content": opened}]
            if not prefills:  # a policy that cannot continue a reply is asked anew
                chat = [*messages, {"role": "assistant", "content": text}]
                chat.append({"role": "user", "content": label})
            follow = dataclasses.replace(
                sampling, max_new_tokens=prompts.budgets.verifier_conclusion
            )
            second = ask(chat, follow.for_call(state["question"], turn, "conclusion"), "\n")
            whole = f"{opened} {second.text.strip()}"
            concluded, said = parse_verdict(whole)
            if said:
                verdict, clear, text = concluded, True, whole
            status = "ok" if said else "unclear"
            records.append(policy_transition("verifier", turn, chat, second, status))
        return verdict_update(runtime, turn, text, verdict, clear, records, error=None)

    return within_run_budget(verifier)
