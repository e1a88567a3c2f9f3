"""The README's `langgraph dev` entry for a trained app: a module-level graph built by
`load_trained(folder).graph(build_app)`, served from the app's own folder by a real server."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("trl")

from test_studio import CLI, langgraph_dev
from tiny_model import build_tiny_model

pytestmark = [
    pytest.mark.slow,  # a training step and a real `langgraph dev` server
    pytest.mark.skipif(
        not CLI.exists() and shutil.which("langgraph") is None,
        reason="langgraph-cli[inmem] is not installed (the dev extra installs it)",
    ),
]

APP = '''
"""A user's app: a router that may call a tool, then a writer that answers."""
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph


@tool
def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"{topic}: nothing known"


def build_app(model):
    router_model = model.bind_tools([lookup])

    def router(state: MessagesState):
        return {"messages": [router_model.invoke(state["messages"])]}

    def writer(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    graph = StateGraph(MessagesState)
    graph.add_node("router", router)
    graph.add_node("writer", writer)
    graph.add_edge(START, "router")
    graph.add_edge("router", "writer")
    graph.add_edge("writer", END)
    return graph.compile()
'''

TRAINED = """
from flowlearn import load_trained
from my_app.app import build_app

graph = load_trained(FOLDER).graph(build_app, max_new_tokens=8)
"""


def trained_result(root: Path, build_app: object) -> Path:
    """`final/` of one training step of the app's two nodes, each on its own adapter."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    from flowlearn.evals.cases import Case
    from flowlearn.evals.scorers import Score
    from flowlearn.graphs import Context, trainable_graph
    from flowlearn.training.roles import with_node_adapters
    from flowlearn.training.trainer import FlowGRPOTrainer

    base = build_tiny_model(root / "base")
    settings = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    nodes = {"router": settings, "writer": settings}
    model = with_node_adapters(AutoModelForCausalLM.from_pretrained(base), nodes)
    args = GRPOConfig(
        output_dir=str(root / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=1,
        learning_rate=1e-3,
        temperature=0.7,
        loss_type="dapo",
        beta=0.0,
        max_completion_length=8,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
    )
    trainer = FlowGRPOTrainer.online(
        model,
        args=args,
        graph_factory=trainable_graph(build_app),  # type: ignore[arg-type]
        scorer=lambda answer, case: Score(min(len(answer), 100) / 100, "length"),
        cases=[Case(str(i), f"Question {i}?", "") for i in range(2)],
        context=Context(planner_temperature=0.7, planner_max_new_tokens=8),
        processing_class=AutoTokenizer.from_pretrained(base),
        nodes=list(nodes),
    )
    trainer.train()
    trainer.save_model(str(root / "final"))
    return root / "final"


def test_langgraph_dev_serves_a_trained_app_from_its_own_folder(tmp_path: Path) -> None:
    from langgraph_sdk import get_client

    app = tmp_path / "app"
    (app / "my_app").mkdir(parents=True)
    (app / "my_app" / "__init__.py").write_text("")
    (app / "my_app" / "app.py").write_text(textwrap.dedent(APP))
    sys.path.insert(0, str(app))
    try:
        from my_app.app import build_app
    finally:
        sys.path.remove(str(app))
    result = trained_result(tmp_path / "training", build_app)
    trained = textwrap.dedent(TRAINED).replace("FOLDER", repr(str(result)))
    (app / "my_app" / "trained.py").write_text(trained)
    graphs = {"my_app": "./my_app/trained.py:graph"}
    (app / "langgraph.json").write_text(json.dumps({"dependencies": ["."], "graphs": graphs}))
    env = {**os.environ, "LANGSMITH_TRACING": "false", "PYTHONPATH": str(app)}

    async def ask(url: str) -> dict:
        client = get_client(url=url)
        thread = await client.threads.create()
        question = {"messages": [{"role": "user", "content": "How tall is Everest?"}]}
        return await client.runs.wait(thread["thread_id"], "my_app", input=question)

    with langgraph_dev(app, env, tmp_path / "server.log") as url:
        state = asyncio.run(ask(url))
    assert "__error__" not in state, (state, (tmp_path / "server.log").read_text()[-2000:])
    messages = state["messages"]
    assert messages[0]["content"] == "How tall is Everest?"
    assert [m["type"] for m in messages] == ["human", "ai", "ai"]  # the router's, the writer's
    assert all(
        m["response_metadata"]["model"] == f"final:{n}"
        for m, n in zip(messages[1:], ("router", "writer"), strict=True)
    )
