"""Give the flow to a LangChain agent (`langchain.agents.create_agent`) as a tool.

Run: `python examples/as_tool.py`. The outer agent's model here is scripted to call the tool
once and then answer; any tool-calling chat model works the same way.
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from scripted_models import scripted_flow

from flowlearn.graphs import as_tool


class ToolCallingFake(GenericFakeChatModel):
    """GenericFakeChatModel that accepts bind_tools, as create_agent requires."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def build_agent(model: Any, flow: Any) -> Any:
    """A LangChain agent whose only tool is the whole AgentFlow flow."""
    return create_agent(model, [as_tool(flow, name="agentflow")])


if __name__ == "__main__":
    outer = ToolCallingFake(
        messages=iter(
            [
                AIMessage(
                    "",
                    tool_calls=[
                        {
                            "name": "agentflow",
                            "args": {"question": "What is 17 * 23?"},
                            "id": "call-1",
                        }
                    ],
                ),
                AIMessage("AgentFlow says 17 * 23 = 391."),
            ]
        )
    )
    result = build_agent(outer, scripted_flow()).invoke(
        {"messages": [("user", "Please compute 17 * 23.")]}
    )
    for message in result["messages"]:
        print(f"{message.type}: {message.content}")
