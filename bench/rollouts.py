"""Rollout throughput: N concurrent flows with batched decoding vs the same flows one at a time.

Run: `python bench/rollouts.py [--flows 16]`. Both arms use the same model (the embedded
SmolLM2-135M default unless --planner names another), the same questions, seeds and token
budgets (`--tokens` caps every call, the planner's and each engine role's), and the real flow
with the default tools and AgentFlow's prompts (`AGENTFLOW_PROMPTS`, the planner's engine being
the same model). The batched arm runs the flows on threads
with `BatchingPolicy` under the planner and the engine; the sequential arm runs them in turn on
the plain `HFPolicy`. Prints trajectories per second and their ratio (target: >= 3x on 2 CPU
cores, >= 10x on a GPU) and writes bench/results/rollouts.json. On a shared machine, use
`--repeats 2` or more: the pair runs again with the arms' order swapped.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import torch

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.chat import HFChatModel
from flowlearn.engine.local import HFPolicy
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS
from flowlearn.nodes.tools import default_tools
from flowlearn.training import collect

RESULTS = Path(__file__).parent / "results" / "rollouts.json"
QUESTIONS = [
    "What is 17 * 23?",
    "What is the capital of France?",
    "What is 128 + 256?",
    "Who wrote Hamlet?",
]


class ForwardProbe:
    """Rows and seconds of each forward pass of a model, from torch hooks outside the policy.

    A forward over one new token per row is a decoding step; any other reads prompts.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.rows: list[int] = []
        self.seconds = {"reading": 0.0, "decoding": 0.0}
        self._started = 0.0
        self._hooks = [
            model.register_forward_pre_hook(self._before, with_kwargs=True),
            model.register_forward_hook(self._after, with_kwargs=True),
        ]

    def _before(self, module, args, kwargs) -> None:
        self._started = time.perf_counter()

    def _after(self, module, args, kwargs, output) -> None:
        ids = kwargs["input_ids"]
        kind = "decoding" if ids.shape[1] == 1 else "reading"
        self.seconds[kind] += time.perf_counter() - self._started
        if kind == "decoding":
            self.rows.append(int(ids.shape[0]))

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()


def run(
    policy: HFPolicy | BatchingPolicy,
    cases: list[Case],
    group: int,
    concurrency: int,
    context: Context,
):
    # every call's budget is the bench's: the engine roles' own (up to 1,024 tokens) would
    # otherwise run a model that never ends its replies, a random one, to them
    tokens = context.planner_max_new_tokens
    engine = HFChatModel(policy=policy, max_new_tokens=tokens, fixed_max_new_tokens=tokens)
    graph = build_agentflow(policy, engine, default_tools(engine), prompts=AGENTFLOW_PROMPTS)
    start = time.perf_counter()
    trajectories = collect(
        graph,
        cases,
        lambda answer, case: Score(0.0, "throughput only"),
        group_size=group,
        concurrency=concurrency,
        context=context,
        progress=True,
    )
    return trajectories, time.perf_counter() - start


def run_probed(policy: BatchingPolicy, cases: list[Case], group: int, flows: int, context: Context):
    """Run the batched arm with a `ForwardProbe` on its model."""
    probe = ForwardProbe(policy.handle.model)
    try:
        trajectories, seconds = run(policy, cases, group, flows, context)
    finally:
        probe.remove()
    return trajectories, seconds, probe


def compare(
    policy: HFPolicy,
    flows: int,
    tokens: int,
    max_turns: int = 1,
    max_wait: float = 0.05,
    repeats: int = 1,
) -> dict:
    """Run `flows` flows batched and the same flows one at a time; return the figures.

    With `repeats` > 1 the pair runs again, in the other order each time (batched first, then
    sequential first, ...), so drift on a shared machine falls on both arms; the speedup is
    the ratio of the arms' total seconds, and each pair's ratio is listed too.
    """
    group = 4
    cases = [
        Case(f"q{i}", QUESTIONS[i % len(QUESTIONS)], "") for i in range(max(1, flows // group))
    ]
    context = Context(  # with the analysis call, as the recorded figures were taken
        max_turns=max_turns,
        planner_max_new_tokens=tokens,
        seed=0,
        max_seconds=None,
        query_analysis=True,
    )
    batched_seconds = sequential_seconds = reading = decoding = 0.0
    sizes: list[int] = []
    pairs = []
    for repeat in range(repeats):
        batched_policy = BatchingPolicy(policy, max_batch_size=flows, max_wait_s=max_wait)
        if repeat % 2 == 0:
            batched, pair_batched, probe = run_probed(batched_policy, cases, group, flows, context)
            sequential, pair_sequential = run(policy, cases, group, 1, context)
        else:
            sequential, pair_sequential = run(policy, cases, group, 1, context)
            batched, pair_batched, probe = run_probed(batched_policy, cases, group, flows, context)
        batched_policy.close()
        pairs.append(pair_sequential / pair_batched)
        batched_seconds += pair_batched
        sequential_seconds += pair_sequential
        sizes += probe.rows
        reading += probe.seconds["reading"]
        decoding += probe.seconds["decoding"]
    planner_tokens = [
        sum(len(t.get("completion_ids") or []) for t in r.transitions if t["node"] == "planner")
        for r in batched
    ]
    return {
        "flows": len(batched),
        "prompt_set": AGENTFLOW_PROMPTS.name,
        "max_turns": max_turns,
        "tokens_per_call": tokens,
        "max_wait_s": max_wait,
        "repeats": repeats,
        "batched_trajectories_per_second": repeats * len(batched) / batched_seconds,
        "sequential_trajectories_per_second": repeats * len(sequential) / sequential_seconds,
        "speedup": sequential_seconds / batched_seconds,
        "speedup_per_pair": pairs,
        "mean_rows_per_forward": sum(sizes) / len(sizes),  # decoding steps
        "batched_shares": {  # of the batched arm's wall time, in the model's forward passes
            "reading_prompts": reading / batched_seconds,
            "decoding": decoding / batched_seconds,
            "outside_forward": 1 - (reading + decoding) / batched_seconds,
        },
        "planner_tokens_per_trajectory": sum(planner_tokens) / len(planner_tokens),
        "engine_budgets_spent": sorted(  # the budgets engine calls ran to (each <= tokens)
            {
                int(spent)
                for r in batched
                for t in r.transitions
                for note in t.get("notes") or []
                for spent in re.findall(r"engine budget spent: (\d+) tokens", note)
            }
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flows", type=int, default=16, help="concurrent flows (16)")
    parser.add_argument("--planner", help="model (default: the embedded SmolLM2-135M)")
    parser.add_argument("--device", help="cpu or cuda (default: CUDA when available)")
    parser.add_argument("--max-turns", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per model call")
    parser.add_argument("--max-wait", type=float, default=0.05, help="batching wait, seconds")
    parser.add_argument(
        "--repeats", type=int, default=1, help="pairs of arms, alternating their order (1)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="where to write the JSON (bench/results/rollouts.json)",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    policy = HFPolicy.from_pretrained(args.planner, device=args.device)
    result = {
        "machine": f"{os.cpu_count()} CPU cores"
        + (f", {torch.cuda.get_device_name()}" if policy.model.device.type == "cuda" else ""),
        "model": policy.version,
        **compare(policy, args.flows, args.tokens, args.max_turns, args.max_wait, args.repeats),
    }
    print(json.dumps(result, indent=2))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"speedup batched / sequential: {result['speedup']:.2f}x; wrote {args.out}")


if __name__ == "__main__":
    main()
