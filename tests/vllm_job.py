"""Two Flow-GRPO steps with the planner on a stand-in of TRL's vLLM generation, per vLLM mode.

`python vllm_job.py MODEL_DIR OUT_DIR` trains once in colocate mode and once in server mode,
1 process or under `accelerate launch`. Rank 0's flows take 3 planner turns, the others' 1, so
the ranks make different numbers of generate calls. Each rank writes OUT_DIR/<mode>.<rank>.json:
its engine's events (syncs, generates, optimizer steps) and how many weight syncs it made.
"""

from __future__ import annotations

import json
import operator
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, TypedDict

sys.path.insert(0, str(Path(__file__).parent))

import torch.distributed
from langgraph.graph import END, START, StateGraph
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig
from vllm_stand_in import Events, StandInClient, StandInVLLMGeneration, checksum

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.nodes import Policy, Sampling, policy_transition
from flowlearn.training import TrajectoryStore
from flowlearn.training.trainer import FlowGRPOTrainer
from flowlearn.training.vllm.trl_engine import PerRankServer, VLLMFactory

SAMPLING = Sampling(temperature=0.7, top_p=1.0, max_new_tokens=6)


class TurnState(TypedDict, total=False):
    question: str
    turn: int
    answer: str
    transitions: Annotated[list[Any], operator.add]


def turns_graph(policy: Policy, turns: int) -> Any:
    """A planner called `turns` times; the answer is its last completion's first token id."""

    def planner(state: TurnState) -> dict[str, Any]:
        turn = state.get("turn", 0) + 1
        messages = [{"role": "user", "content": f"{state['question']}\nTurn {turn}. Tool:"}]
        generation = policy.generate(messages, SAMPLING)
        first = (generation.completion_ids or [0])[0]
        record = policy_transition("planner", turn, messages, generation)
        return {"turn": turn, "answer": str(first), "transitions": [record]}

    def route_after_planner(state: TurnState) -> Literal["planner", "__end__"]:
        return "planner" if state["turn"] < turns else END

    graph = StateGraph(TurnState)
    graph.add_node("planner", planner)
    graph.add_edge(START, "planner")
    graph.add_conditional_edges("planner", route_after_planner)
    return graph.compile()


class RecordSteps(TrainerCallback):  # type: ignore[misc]
    """Append ("step", weight checksum) to the events after each optimizer step."""

    def __init__(self, events: Events) -> None:
        self.events = events

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.events.append(("step", checksum(kwargs["model"])))


def token_score(answer: str, case: Case) -> Score:
    """Score the answer's token id modulo 7: rollouts of one question rarely tie."""
    return Score(int(answer) % 7 / 6, "token id modulo 7")


def stand_in_factory(mode: str, events: Events) -> VLLMFactory:
    """Return a factory of the stand-in engine: colocate as is, server through PerRankServer."""

    def build(model: Any, accelerator: Any, processing_class: Any) -> Any:
        generation = StandInVLLMGeneration(
            model, accelerator, processing_class, mode, events=events
        )
        if mode == "colocate":
            return generation
        client = StandInClient(generation)
        return PerRankServer(generation, client, "processed", max_model_length=8192)

    return build


def config(out: Path, mode: str, rollouts: int) -> GRPOConfig:
    """Two updates on CPU, `rollouts` per process and step, G = 2, the planner on vLLM."""
    return GRPOConfig(
        output_dir=str(out),
        use_vllm=True,
        vllm_mode=mode,
        per_device_train_batch_size=rollouts,
        num_generations=2,
        steps_per_generation=1,
        max_steps=2,
        learning_rate=0.05,  # large: a rollout on unsynced weights would show in its logprobs
        temperature=SAMPLING.temperature,
        loss_type="dapo",
        beta=0.0,
        max_completion_length=SAMPLING.max_new_tokens,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        gradient_checkpointing=False,
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        seed=0,
    )


def train(model_dir: Path, out: Path, mode: str, turns: int, rollouts: int) -> dict[str, Any]:
    """Train two steps with the stand-in engine; return what each rank saw and logged."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    events: Events = []
    store = TrajectoryStore(out / mode / "rollouts.jsonl")
    trainer = FlowGRPOTrainer.online(
        model,
        args=config(out / mode, mode, rollouts),
        graph_factory=lambda policy: turns_graph(policy, turns),
        scorer=token_score,
        cases=[Case(f"q{i}", f"What is {i} + {i}?", "0") for i in range(8)],
        processing_class=tokenizer,
        rollout_store=store,
        rollout_concurrency=rollouts,
        callbacks=[RecordSteps(events)],
        vllm=stand_in_factory(mode, events),
    )
    events.append(("initial", checksum(model)))
    trainer.train()
    assert trainer.vllm is not None
    logs = [h for h in trainer.state.log_history if "flow/rows" in h]
    return {"events": events, "syncs": trainer.vllm.syncs, "logs": logs}


def main(model_dir: str, out: str) -> None:
    rank = int(os.environ.get("RANK", "0"))  # set by accelerate's torchrun launcher
    for mode in ("colocate", "server"):
        seen = train(Path(model_dir), Path(out), mode, turns=3 if rank == 0 else 1, rollouts=2)
        (Path(out) / f"{mode}.{rank}.json").write_text(json.dumps(seen))
    # Both ranks leave together and close the process group themselves: left to interpreter
    # exit, gloo's threads were torn down mid-flight now and then ("terminate called without
    # an active exception", rank 1 aborted; 2 of 7 local runs in session 14).
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
