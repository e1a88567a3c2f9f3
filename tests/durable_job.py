"""A child process for the kill -9 test: a 4-step run on a SQLite thread, one step a second."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver

from fakes import FakeChatModel, ScriptedPolicy, plan
from flowlearn.graphs import Context, build_agentflow


def main(db: str, log: str, delay: float) -> None:
    @tool
    def step_tool(query: str) -> str:
        """Do one slow step."""
        with open(log, "a") as handle:  # one line per tool call actually made
            handle.write("call\n")
        time.sleep(delay)
        return "done"

    engine = FakeChatModel(
        default_args={"query": "x"}, text="Conclusion: CONTINUE <answer>ok</answer>"
    )
    config = {"configurable": {"thread_id": "job"}}
    with SqliteSaver.from_conn_string(db) as saver:
        graph = build_agentflow(
            ScriptedPolicy([plan("step_tool")]), engine, [step_tool], checkpointer=saver
        )
        resume = saver.get_tuple(config) is not None
        graph.invoke(None if resume else {"question": "q"}, config, context=Context(max_turns=4))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
