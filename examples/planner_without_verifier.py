"""Compose a variant of the flow from flowlearn's parts: no verifier, a fixed number of turns.

The planner loops straight back to itself after each tool call, and its own budget check
(`Context.max_turns`) ends the loop; the generator then answers. Run it with
`python examples/planner_without_verifier.py`; it uses LangChain's scripted fake chat models so it
needs no weights. Swap in `HFPolicy` / your own chat model for real use.
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.tools import BaseTool, tool
from langgraph.graph import END, START, StateGraph

from flowlearn import (
    ChatModelPolicy,
    Context,
    InputState,
    Policy,
    State,
    make_executor,
    make_generator,
    make_planner,
)


def route_after_planner(state: State) -> Literal["executor", "planner", "generator"]:
    """Like flowlearn's router, shown here to make the loop explicit."""
    if state.get("termination"):
        return "generator"
    return "executor" if state.get("plan") else "planner"


def build_graph(policy: Policy, engine: BaseChatModel, tools: list[BaseTool]) -> Any:
    """Planner -> executor -> planner ... -> generator, with no verifier."""
    graph = StateGraph(State, context_schema=Context, input_schema=InputState)
    graph.add_node("planner", make_planner(policy, tools, analysis_engine=engine))
    graph.add_node("executor", make_executor(engine, tools))
    graph.add_node("generator", make_generator(engine))
    graph.add_edge(START, "planner")
    graph.add_conditional_edges("planner", route_after_planner)
    graph.add_edge("executor", "planner")
    graph.add_edge("generator", END)
    return graph.compile(name="planner-without-verifier")


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def main() -> None:
    planner = FakeListChatModel(
        responses=["Context: 17 and 23\nSub-Goal: multiply 17 by 23\nTool Name: multiply"]
    )
    engine = FakeListChatModel(
        responses=[
            "The question asks for a product of two integers.",  # query analysis
            '{"a": 17, "b": 23}',  # executor arguments, turn 1
            '{"a": 17, "b": 23}',  # executor arguments, turn 2
            "17 * 23 = 391. <answer>391</answer>",  # generator
        ]
    )
    graph = build_graph(ChatModelPolicy(planner), engine, [multiply])
    final: dict[str, Any] = {}
    for update in graph.stream(
        {"question": "What is 17 * 23?"}, context=Context(max_turns=2), stream_mode="updates"
    ):
        node, values = next(iter(update.items()))
        print(node)
        final = values or final
    print("answer:", final["answer"], "| termination:", final["termination"])


if __name__ == "__main__":
    main()
