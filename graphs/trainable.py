"""Train any LangGraph app: a chat model that knows the calling node, a recorder, an adapter.

Why it is built this way:
1. LangGraph names the running node in every call's metadata (`langgraph_node`), so a chat
   model can tell which node called it without that node's help. `TrainableChatModel` runs
   each trained node's calls on that node's policy (its own adapter) and every other node's on
   the base, and writes each call, with the exact ids and logprobs its policy logged and the
   chat as the policy saw it, as a `Transition` of that node. A user's graph then trains with
   no flowlearn node in it: only the model it is built with changes.
2. The transitions go to one run's `TransitionRecorder`, handed to that run's `invoke` in its
   config's callbacks: LangGraph passes callbacks to every call inside the run (parallel
   branches and subgraphs too) and to no other run, so rollouts running at once in threads
   never share a list. The chat model finds it among the call's handlers, as LangChain finds
   its streaming handlers; nothing of the record travels in the reply, so none of it lands in
   the graph's state.
3. The chat model samples with the run context's planner settings (TRL's `temperature`,
   `top_p` and `max_completion_length`, which the trainer checks the rows against), bound
   when the graph is built: `TrainableGraph` builds the user's graph once per settings, not
   once per rollout. Training hands it one `PolicyRef` for the whole run, each step's policy
   swapped into it, so the user's graph is not rebuilt per step either.
4. Only this chat model's calls are recorded; a node that calls another model runs as it is
   and is not trained.
5. A key never reaches the policy, so none is in a record either. A user's tool may echo a key
   (a 403 quoting it, a config it read), and the graph passes the ToolMessage on to the model
   as it is. The chat model redacts every message (`flowlearn.secrets`) before the
   policy reads it, as flowlearn's own executor redacts a tool's result before memory: the
   recorded `prompt_ids` stay exactly what the policy read, which training needs, and hold
   `[redacted]`, not the key, as the recorded messages do. Redacting only the recorded text
   would have left the key in the ids, where anyone can decode it; dropping such calls would
   have lost rows. The reply the graph gets back is the policy's own, unredacted; what is
   written of a rollout (the trajectory store, Parquet) is redacted once more as a whole when it
   is serialised (`Trajectory.to_json`), which covers the answer, a reward's reason and the
   completion text too; completion ids are kept as sampled.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from langchain_core.callbacks import BaseCallbackHandler, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import merge_configs
from pydantic import Field

from flowlearn.engine.adapters import by_node
from flowlearn.engine.chat import HFChatModel
from flowlearn.engine.local import LocalPolicy
from flowlearn.engine.protocol import local_tokenizer, policy_tokenizer
from flowlearn.engine.sampling import Generation, Messages, Sampling
from flowlearn.nodes.render import policy_transition
from flowlearn.nodes.schema.context import Context
from flowlearn.nodes.schema.records import Transition
from flowlearn.secrets import redact_record

__all__ = [
    "NODE_KEY",
    "TrainableChatModel",
    "TrainableGraph",
    "TransitionRecorder",
    "calling_node",
    "last_ai_text",
    "messages_input",
    "redact_chat",
    "trainable_graph",
]

NODE_KEY = "langgraph_node"
"""The metadata key under which LangGraph names the node a call runs in."""
OUTSIDE_GRAPH = "model"
"""The node a recorded call made outside any graph node is filed under."""


class TransitionRecorder(BaseCallbackHandler):
    """One run's record of its `TrainableChatModel` calls, as transitions of the calling nodes.

    Hand it to one run, `graph.invoke(inputs, config={"callbacks": [recorder]})`; then
    `transitions` holds a `Transition` per call of a `TrainableChatModel` in that run, in the
    order the calls finished. Its `node` is the calling graph node's name (the innermost
    node's, in a subgraph; `OUTSIDE_GRAPH` for a call made outside any node) and its `turn`
    that node's count of recorded calls in the run, from 1. It handles no callback event:
    the chat model finds it among the call's handlers and hands it each call.
    """

    run_inline = True
    """Never moved to an executor under an async run: it has no event to handle there."""

    def __init__(self) -> None:
        """Start with no transitions."""
        self.transitions: list[Transition] = []
        self._turns: Counter[str] = Counter()
        self._lock = threading.Lock()  # a run's parallel branches call from several threads

    def record(self, node: str, messages: Messages, generation: Generation) -> Transition:
        """Append the call's transition as `node`'s next turn, and return it."""
        with self._lock:
            self._turns[node] += 1
            transition = policy_transition(node, self._turns[node], messages, generation)
            self.transitions.append(transition)
        return transition


class TrainableChatModel(HFChatModel):
    """`HFChatModel` whose calls run on the calling node's policy, and are recorded.

    `node_policies` maps each trained node (a graph node's name) to its policy; every other
    node's calls, and calls made outside a graph, run on `policy` (with several trained nodes,
    the base with every adapter off). Each call that samples is handed, as a `Transition`, to
    the `TransitionRecorder` among the run's callbacks, if there is one.

    The policies are local (`HFPolicy` and its wrappers: the adapter switched per call) or
    served (`ServerPolicy` with the model's tokenizer, each node naming its adapter on the
    server): the prompt is rendered here either way, so the ids are exact.

    The policy reads every message redacted (`flowlearn.secrets.redact`: known keys and
    secret-shaped credentials become `[redacted]`), so no key is in what it reads, nor in the
    recorded messages and prompt ids (the module docstring, point 5).
    """

    policy: Any = Field(exclude=True)
    """The policy of the nodes not trained: a local one, or a served one with its tokenizer."""
    node_policies: dict[str, Any] = Field(default_factory=dict, exclude=True)
    """Each trained node's policy, by the name of the graph node that calls this model."""
    disable_streaming: bool | Literal["tool_calling"] = True
    """A streamed call is invoked and its whole reply yielded as one chunk: LangChain streams
    without the call's callbacks, which name its node and hold the run's recorder."""

    @classmethod
    def over(cls, policy: Any, **fields: Any) -> TrainableChatModel:
        """Return the chat model over the live policy: one, or policies by node (`by_node`)."""
        nodes = by_node(policy)
        return cls(policy=nodes.base, node_policies=dict(nodes.trained), **fields)

    @property
    def _llm_type(self) -> str:
        return "flowlearn-trainable"

    def model_post_init(self, context: Any, /) -> None:
        """Refuse a policy whose tokenizer is not at hand here.

        Raises:
            ValueError: a policy without the model's tokenizer here (`require_tokenizers`).

        """
        super().model_post_init(context)
        require_tokenizers(self.policy, self.node_policies)

    def _policy_for(self, run_manager: CallbackManagerForLLMRun | None) -> Any:
        """Return the calling node's policy, or the base's for a node not trained."""
        policy = self.node_policies.get(calling_node(run_manager))
        return policy if policy is not None else self.policy

    def _tokenizer(self) -> Any:
        """Return the tokenizer of the base's policy (local or served; the nodes share it)."""
        return policy_tokenizer(self.policy)

    def _stop_ids(self) -> set[int]:
        """Return the ids that end a completion: a local model's, else its tokenizer's EOS."""
        if local_tokenizer(self.policy) is not None:
            return super()._stop_ids()
        eos = self._tokenizer().eos_token_id
        return set(eos if isinstance(eos, list) else [eos])

    def _prepare(
        self, messages: list[BaseMessage], kwargs: dict[str, Any]
    ) -> tuple[Messages, Sampling, list[dict[str, Any]], str | None]:
        """Return the chat the policy reads, redacted, with the call's sampling and tools."""
        chat, sampling, tools, choice = super()._prepare(messages, kwargs)
        return redact_chat(chat), sampling, tools, choice

    def _chosen(self, policy: LocalPolicy, chat: Messages, kwargs: dict[str, Any]) -> ChatResult:
        """Reply with one of the call's choices, scored over the redacted chat."""
        return super()._chosen(policy, redact_chat(chat), kwargs)

    def _on_generation(
        self, run_manager: CallbackManagerForLLMRun | None, chat: Messages, generation: Generation
    ) -> None:
        """Hand the call to the run's recorder, as a transition of the calling node."""
        handlers = run_manager.handlers if run_manager is not None else []
        for recorder in (h for h in handlers if isinstance(h, TransitionRecorder)):
            recorder.record(calling_node(run_manager), list(chat), generation)


def require_tokenizers(base: Any, nodes: Mapping[str, Any]) -> None:
    """Refuse policies whose tokenizer is not at hand here (`policy_tokenizer`).

    Raises:
        ValueError: the base's or a node's policy without one (a chat model's, or a
            `ServerPolicy` built without a tokenizer): the chat model renders prompts into
            exact token ids, and reads replies, with it.

    """
    for name, policy in [("base", base), *nodes.items()]:
        if policy_tokenizer(policy) is None:
            raise ValueError(
                f"your graph's chat model renders prompts into token ids with the model's "
                f"tokenizer; the {name} policy, a {type(policy).__name__}, has none here: use "
                "a local model, or a served one given the model's tokenizer (ServerPolicy("
                "..., tokenizer=...), which planner_url's training and load_trained give it)"
            )


def redact_chat(chat: Messages) -> Messages:
    """Return `chat` with every message's content redacted (`flowlearn.secrets.redact`)."""
    redacted: Messages = redact_record(chat)
    return redacted


def calling_node(run_manager: CallbackManagerForLLMRun | None) -> str:
    """Return the name of the graph node a call runs in (`OUTSIDE_GRAPH` outside any)."""
    node = run_manager.metadata.get(NODE_KEY) if run_manager is not None else None
    return node if isinstance(node, str) and node else OUTSIDE_GRAPH


def messages_input(question: str) -> dict[str, Any]:
    """Return a `MessagesState` input: the question as the one user message."""
    return {"messages": [HumanMessage(content=question)]}


def last_ai_text(state: Mapping[str, Any]) -> str:
    """Return the text of the last AI message in `state["messages"]`, or "" if there is none."""
    for message in reversed(state.get("messages") or []):
        if isinstance(message, AIMessage):
            return message.text
    return ""


@dataclass
class TrainableGraph:
    """A user's graph as the trainer runs a rollout: question in; answer and transitions out.

    `invoke({"question": q}, context=...)` builds the graph's input (`inputs`), runs the
    user's graph with a fresh `TransitionRecorder`, and returns the state a trajectory is made
    of: `question`, `answer` and `final_text` (`answer` of the final state), `transitions`,
    `turn` (the recorded calls), `seconds`, and the user's final `state`.
    """

    build: Callable[[BaseChatModel], Any]
    """From a chat model to the user's compiled graph; its learning nodes call that model."""
    policy: Any
    """The live policy: one (every node's calls train it), or policies by node (`NodePolicies`;
    in training, the run's `PolicyRef`)."""
    inputs: Callable[[str], Mapping[str, Any]] = messages_input
    """From the question to the graph's input."""
    answer: Callable[[Mapping[str, Any]], str] = last_ai_text
    """From the graph's final state to the answer the reward scores."""
    _built: dict[Sampling, Any] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        """Refuse a policy the chat model cannot run on, before any rollout starts.

        Raises:
            ValueError: a policy (or a node's) without the model's tokenizer here
                (`require_tokenizers`).

        """
        nodes = by_node(self.policy)
        require_tokenizers(nodes.base, nodes.trained)

    def graph(self, sampling: Sampling) -> Any:
        """Return the user's graph around a chat model sampling with `sampling` (built once)."""
        key = dataclasses.replace(sampling, seed=None)
        with self._lock:  # the step's first rollouts arrive together: one builds, all wait
            if key not in self._built:
                model = TrainableChatModel.over(
                    self.policy,
                    temperature=key.temperature,
                    top_p=key.top_p,
                    max_new_tokens=key.max_new_tokens,
                )
                self._built[key] = graph = self.build(model)
                warn_unknown_nodes(graph, self.policy)
            return self._built[key]

    def invoke(
        self,
        input: Mapping[str, Any],
        context: Context | None = None,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Run the user's graph on `input["question"]`, recording its calls.

        `context` is flowlearn's run `Context` (its planner sampling settings apply to every
        call of the chat model; default `Context()`'s); it is not passed to the user's graph.
        `config` and `kwargs` go to the user's graph's `invoke`, the recorder added to the
        config's callbacks.

        Raises:
            TypeError: a `context` that is not a flowlearn `Context`.

        """
        if context is not None and not isinstance(context, Context):
            raise TypeError(
                f"context must be flowlearn's Context (its planner sampling settings), got "
                f"{type(context).__name__}; a context of your graph's own is not passed on to it"
            )
        question = str(input["question"])
        run_context = context or Context()
        recorder = TransitionRecorder()
        start = time.perf_counter()
        state = self.graph(run_context.planner_sampling()).invoke(
            self.inputs(question),
            config=merge_configs(config, {"callbacks": [recorder]}),
            **kwargs,
        )
        answer = self.answer(state)
        return {
            "question": question,
            "answer": answer,
            "final_text": answer,
            "transitions": recorder.transitions,
            "turn": len(recorder.transitions),
            "seconds": time.perf_counter() - start,
            "state": state,
        }


def trainable_graph(
    build: Callable[[BaseChatModel], Any],
    *,
    inputs: Callable[[str], Mapping[str, Any]] = messages_input,
    answer: Callable[[Mapping[str, Any]], str] = last_ai_text,
) -> Callable[[Any], TrainableGraph]:
    """Return a `graph_factory` for `FlowGRPOTrainer` that trains your own LangGraph app.

    Args:
        build: from a chat model to your compiled graph. Every node that should learn calls
            that model (bound tools and `.bind(...)` as usual); nodes are trained by their graph
            names (`train_nodes`, or the trainer's `nodes` with an adapter per node), the
            others run on the base. Called once per run's sampling settings with a
            `TrainableChatModel` over the live policy (training swaps each step's into it).
        inputs: from the question to your graph's input; default: one user message in
            `messages` (`MessagesState`).
        answer: from your graph's final state to the answer the reward functions score;
            default: the last AI message's text.

    Returns `factory(policy) -> TrainableGraph`, what `graph_factory=` takes.

    """

    def factory(policy: Any) -> TrainableGraph:
        return TrainableGraph(build, policy, inputs, answer)

    return factory


def warn_unknown_nodes(graph: Any, policy: Any) -> None:
    """Warn about a trained node that is no node of `graph`: it would have no rows."""
    trained = list(by_node(policy).trained)
    if not trained or not hasattr(graph, "get_graph"):  # one policy, or not a LangGraph app
        return
    names = {str(node).rsplit(":", 1)[-1] for node in graph.get_graph(xray=True).nodes}
    unknown = [node for node in trained if node not in names]
    if unknown:
        known = sorted(names - {"__start__", "__end__"})
        warnings.warn(
            f"trained nodes {unknown} are not nodes of the graph (its nodes: {known}); only "
            "calls made inside a node named in train_nodes are trained",
            stacklevel=3,
        )
