"""Use the flow as one node of a parent graph whose state has different keys.

Run: `python examples/parent_graph.py`. The parent's `user_query` goes in as the flow's
`question`; the flow's `answer` (and, here, its `memory`) come back under the parent's own keys.
"""

from __future__ import annotations

from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph
from scripted_models import scripted_flow

from flowlearn.graphs import subgraph_node


class ParentState(TypedDict, total=False):
    user_query: str
    solution: str
    agent_memory: list[dict[str, Any]]
    reply: str


def build_parent(flow: Any) -> Any:
    """A two-node app: the flow solves, a formatter writes the reply."""
    graph = StateGraph(ParentState)
    graph.add_node(
        "solve",
        subgraph_node(
            flow,
            question_key="user_query",
            answer_key="solution",
            extra_keys={"memory": "agent_memory"},
        ),
    )
    graph.add_node("reply", lambda state: {"reply": f"The answer is {state['solution']}."})
    graph.add_edge(START, "solve")
    graph.add_edge("solve", "reply")
    graph.add_edge("reply", END)
    return graph.compile()


if __name__ == "__main__":
    result = build_parent(scripted_flow()).invoke({"user_query": "What is 17 * 23?"})
    print(result["reply"], f"({len(result['agent_memory'])} memory records)")
