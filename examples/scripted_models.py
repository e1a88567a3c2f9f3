"""Scripted stand-in models so the examples run anywhere, instantly, with no weights.

Swap in `flowlearn.compose.load_local_models()` (or any LangChain chat model) for real use.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.tools import tool

from flowlearn import ChatModelPolicy, build_agentflow


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def scripted_flow(**kwargs: Any) -> Any:
    """A flow whose planner always multiplies and whose engine answers 391."""
    planner = FakeListChatModel(responses=["Sub-Goal: multiply 17 by 23\nTool Name: multiply"])
    engine = FakeListChatModel(
        responses=[
            "The question asks for a product of two integers; multiply computes it.",  # analysis
            '{"a": 17, "b": 23}',  # executor arguments
            "The product is known.\nConclusion: STOP",  # verifier
            "17 * 23 = 391. <answer>391</answer>",  # generator
        ]
    )
    return build_agentflow(ChatModelPolicy(planner), engine, [multiply], **kwargs)
