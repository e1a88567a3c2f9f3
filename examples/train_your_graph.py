"""Train a LangGraph app of your own with Flow-GRPO: each node that calls the model learns.

Run: `python examples/train_your_graph.py` (offline, under a minute on 2 CPU cores;
`--help` lists the options). The app is the kind you already have: a `router` node asks the
chat model which tool fits the question (`calculator` or `lookup`), LangGraph's `ToolNode`
runs it, and a `writer` node answers from the result. Nothing in it is flowlearn's; training
changes only the chat model it is built with: `trainable_graph(build_app)` builds it with a
`TrainableChatModel`, which runs each trained node's calls on that node's own LoRA adapter
and records them token by token. The reward functions are TRL's shape: exact match on the
answer, plus a brevity term.

Without `--model`, a tiny random Qwen2 is built in a temporary folder: it writes noise, so
the run shows the mechanics (rows from both nodes, both adapters updated), not learning. That
base is saved beside the adapters (`base-model/` in the output folder), since the adapters are
only usable on the model they were trained on and the temporary folder goes at exit.
Name an instruct model (`--model Qwen/Qwen2.5-0.5B-Instruct`, a hub id already in the cache,
or a folder) to train for real.

It ends as your app would start: `flowlearn.load_trained(final)` loads the result (the base
once, each trained node's adapter on it), the app is built with its chat model and answers a
question it never trained on, and the `vllm serve` command that serves the same result, one
LoRA adapter per node, is printed.
"""

from __future__ import annotations

import argparse
import ast
import operator
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

ROUTER_PROMPT = (
    "Pick the tool that answers the question: calculator for arithmetic, lookup for facts."
)
WRITER_PROMPT = "Answer the question in a few words, from the tool's result if there is one."

FACTS = {
    "kenya": "The capital of Kenya is Nairobi.",
    "mars": "Mars is known as the Red Planet.",
    "everest": "Mount Everest is 8849 metres high.",
}
QUESTIONS = [
    {"question": "What is 17 * 23?", "answer": "391"},
    {"question": "What is the capital of Kenya?", "answer": "Nairobi"},
    {"question": "What is 12 + 30?", "answer": "42"},
    {"question": "Which planet is known as the Red Planet?", "answer": "Mars"},
]
APP_NODES = ("router", "writer")
"""The app's nodes that call the chat model: the ones that can be trained."""
NEW_QUESTION = "What is 6 * 7?"
"""A question training never saw, for the trained app."""


# ---- The app: plain LangGraph, built around whatever chat model it is given ----------------

_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression such as 17 * 23."""

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"not arithmetic: {expression!r}")

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"


@tool
def lookup(topic: str) -> str:
    """Look a topic up in a small offline encyclopedia."""
    found = [fact for key, fact in FACTS.items() if key in topic.lower()]
    return " ".join(found) or f"nothing known about {topic!r}"


def route_after_router(state: MessagesState) -> Literal["tools", "writer"]:
    """Run the tool the router called, or go straight to the writer."""
    last = state["messages"][-1]
    return "tools" if isinstance(last, AIMessage) and last.tool_calls else "writer"


def build_app(model: BaseChatModel) -> Any:
    """Compile the app: router -> (tools ->) writer."""
    tools = [calculator, lookup]
    router_model = model.bind_tools(tools)

    def router(state: MessagesState) -> dict[str, Any]:
        reply = router_model.invoke([SystemMessage(ROUTER_PROMPT), *state["messages"]])
        return {"messages": [reply]}

    def writer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke([SystemMessage(WRITER_PROMPT), *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("router", router)
    graph.add_node("tools", ToolNode(tools))
    graph.add_node("writer", writer)
    graph.add_edge(START, "router")
    graph.add_conditional_edges("router", route_after_router)
    graph.add_edge("tools", "writer")
    graph.add_edge("writer", END)
    return graph.compile()


# ---- Training it -----------------------------------------------------------------------------


def brevity(completions: list[str], **kwargs: Any) -> list[float]:
    """Reward short answers (TRL's reward shape): 1 for an empty one, 0 from 100 characters.

    >>> brevity(["391", "x" * 200])
    [0.97, 0.0]
    """
    return [max(0.0, 1 - len(completion) / 100) for completion in completions]


def load_model(name: str | None, scratch: Path) -> tuple[Any, Any]:
    """Load the model to train and its tokenizer; without a name, build a tiny one."""
    from tiny_model import build_tiny_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name is None:
        texts = [ROUTER_PROMPT, WRITER_PROMPT, *FACTS.values(), *(q["question"] for q in QUESTIONS)]
        name = str(build_tiny_model(scratch / "tiny-model", texts))
    return AutoModelForCausalLM.from_pretrained(name), AutoTokenizer.from_pretrained(name)


def train(options: argparse.Namespace, scratch: Path) -> Any:
    """Train the app's chosen nodes, an adapter each, and return the trainer."""
    from datasets import Dataset
    from peft import LoraConfig

    from flowlearn.graphs import trainable_graph
    from flowlearn.training.config import FlowGRPOConfig
    from flowlearn.training.roles import with_node_adapters
    from flowlearn.training.trainer import FlowGRPOTrainer

    model, tokenizer = load_model(options.model, scratch)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = FlowGRPOTrainer(
        model=with_node_adapters(model, {node: lora for node in options.nodes}),
        reward_funcs=["exact_match", brevity],
        args=FlowGRPOConfig(
            output_dir=str(options.output_dir),
            train_nodes=options.nodes,  # the graph's own node names
            max_steps=options.steps,
            questions_per_step=2,
            num_generations=options.num_generations,
            max_completion_length=options.max_new_tokens,  # each call's token budget
            learning_rate=options.learning_rate,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
        ),
        train_dataset=Dataset.from_list(QUESTIONS),
        graph_factory=trainable_graph(build_app),
        processing_class=tokenizer,
    )
    trainer.train()
    final = options.output_dir / "final"
    trainer.save_model(str(final))
    if options.model is None:  # the built base lives in the temporary folder: keep a copy
        from flowlearn.engine.saved_adapters import write_adapters_record

        kept = shutil.copytree(scratch / "tiny-model", options.output_dir / "base-model")
        write_adapters_record(final, str(kept), options.nodes)
    return trainer


# ---- Using it: your app with its trained nodes ------------------------------------------------


def run_trained(final: Path, question: str, max_new_tokens: int) -> None:
    """Run the app with its trained nodes on a new question; print how to serve them."""
    from langchain_core.messages import HumanMessage

    from flowlearn import load_trained

    trained = load_trained(final)  # the base once; each call runs on its node's adapter
    app = trained.graph(build_app, max_new_tokens=max_new_tokens)  # = build_app(chat model)
    state = app.invoke({"messages": [HumanMessage(question)]})
    print(f"trained app, asked {question!r}: {state['messages'][-1].text!r}")
    print("serve it on vLLM:", trained.serve_command_line())


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Read the command line; unknown nodes are errors."""
    parser = argparse.ArgumentParser(
        description="Train the nodes of a two-node LangGraph app (router, writer) with "
        "Flow-GRPO, an adapter per node, offline on CPU."
    )
    parser.add_argument(
        "--model", help="model to train (hub id or folder); default: a tiny one built here"
    )
    parser.add_argument("--steps", type=int, default=2, help="training steps (default 2)")
    parser.add_argument(
        "--output-dir", type=Path, help="where metrics and final/ go; default: a temp folder"
    )
    parser.add_argument(
        "--nodes",
        default=",".join(APP_NODES),
        help="comma-separated nodes to train, each on its own adapter (default router,writer)",
    )
    parser.add_argument(
        "--num-generations", type=int, default=2, help="rollouts per question, G (default 2)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=24, help="tokens per model call (default 24)"
    )
    parser.add_argument(
        "--learning-rate", type=float, default=1e-3, help="adapters' learning rate (1e-3)"
    )
    options = parser.parse_args(argv)
    options.nodes = [n.strip() for n in options.nodes.split(",") if n.strip()]
    unknown = sorted(set(options.nodes) - set(APP_NODES)) or ([] if options.nodes else ["none"])
    if unknown:
        parser.error(f"--nodes: {unknown} are not nodes that call the model; use {APP_NODES}")
    return options


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    with tempfile.TemporaryDirectory() as scratch:
        options.output_dir = options.output_dir or Path(scratch) / "run"
        trainer = train(options, Path(scratch))
        for entry in (h for h in trainer.state.log_history if "flow/mean_reward" in h):
            rows = ", ".join(f"{n} {entry.get(f'flow/{n}/rows', 0):.0f}" for n in options.nodes)
            print(f"step {entry['step']}: reward {entry['flow/mean_reward']:.3f} | rows: {rows}")
        final = options.output_dir / "final"
        print("adapters:", ", ".join(str(final / n) for n in options.nodes if (final / n).is_dir()))
        run_trained(final, NEW_QUESTION, options.max_new_tokens)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
