"""Run the flow with `ainvoke` and watch its step events with `astream`.

Run: `python examples/async_stream.py`. `stream_mode="custom"` carries one event per planner
decision, tool call and verdict (what Studio shows); "updates" carries each node's state changes.
"""

from __future__ import annotations

import asyncio

from scripted_models import scripted_flow


async def main() -> None:
    flow = scripted_flow()
    async for mode, payload in flow.astream(
        {"question": "What is 17 * 23?"}, stream_mode=["custom", "updates"]
    ):
        if mode == "custom":
            print("event:", payload)
    state = await scripted_flow().ainvoke({"question": "What is 17 * 23?"})
    print("answer:", state["answer"])


if __name__ == "__main__":
    asyncio.run(main())
