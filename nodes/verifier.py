"""The verifier: judges whether memory answers the question, and stores its verdict.

A reply with no clear `Conclusion:` line is continued once: a second engine call sees the
reply so far and the label `Conclusion:` (`Prompts.verifier_conclusion`), and its word is the
verdict. When the prompts name `verdict_choices` and the engine can score them
(`ChoosingModel`: the local models), it chooses among them there; another writes a few words,
read as before. Both calls are recorded as verifier transitions of the turn; an engine that
concludes on its own is called once. Anything still unclear means CONTINUE, as in AgentFlow.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.tools import BaseTool
from langgraph.types import RetryPolicy

from flowlearn.engine.protocol import can_choose
from flowlearn.engine.sampling import Messages
from flowlearn.nodes.catalogue import enabled_tools, render_catalogue
from flowlearn.nodes.engine_calls import EngineReply, RoleCall, role_call
from flowlearn.nodes.parsing import parse_verdict
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts, runs_analysis
from flowlearn.nodes.render import emit, memory_prompt, transition
from flowlearn.nodes.retry import ENGINE_RETRY
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


def make_verifier(
    engine: BaseChatModel,
    tools: Sequence[BaseTool] = (),
    *,
    prompts: Prompts = AGENTFLOW_PROMPTS,
    retry: RetryPolicy | None = ENGINE_RETRY,
) -> Callable[..., dict[str, Any]]:
    """Build the verifier node over the fixed engine.

    Args:
        engine: The fixed chat model that judges the memory.
        tools: The tools bound to the graph, shown in its prompt (`Context.tools` may enable a
            subset per run).
        prompts: The template, conclusion label, verdict choices and budgets it uses.
        retry: How its transient engine errors are retried (None: never).

    """
    tools = list(tools)
    budgets = prompts.budgets
    ask = role_call(engine, retry, max_tokens=budgets.verifier)
    if prompts.verdict_choices and can_choose(engine):
        conclude = role_call(engine, retry, choice=prompts.verdict_choices)
    else:
        conclude = role_call(engine, retry, max_tokens=budgets.verifier_conclusion, stop=["\n"])

    def verifier(state: State, runtime: Runtime[Context]) -> dict[str, Any]:
        turn = state.get("turn", 0)
        context = runtime.context or Context()
        template = prompts.template("verifier", analysis=runs_analysis(context, prompts))
        shows_tools = tools and "{tools}" in template
        catalogue = render_catalogue(enabled_tools(tools, context.tools)) if shows_tools else ""
        messages = memory_prompt(template, state, system=prompts.system, tools=catalogue)
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
        update: dict[str, Any] = {
            "verdict": verdict,
            "memory": [
                {"turn": turn, "kind": "verification", "analysis": text, "verdict": verdict}
            ],
            "transitions": records,
        }
        emit(runtime, {"event": "verdict", "turn": turn, "verdict": verdict, "clear": clear})
        if verdict == "STOP":
            update["termination"] = "engine_error" if error else "verifier_stop"
        return update

    return verifier
