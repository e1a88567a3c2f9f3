"""Rollout throughput: N concurrent flows with batched decoding vs the same flows one at a time.

Run: `python bench/rollouts.py [--flows 8] [--repeats 3]`, or `--tiny` (a tiny random Qwen2 built
locally: the model's compute is almost free, so the host's cost shows). Every arm runs the real
flow (AgentFlow's prompts, the default tools, the planner's engine the same model) on the same
questions, 4 rollouts each, seeded alike (rollout k of a group draws with seed k), with the
planner sampled at the training temperature (0.7, `--temperature`) and every call capped at
`--tokens` new tokens, the planner's and each engine role's. The arms:

- `sequential`: the flows one at a time on the plain `HFPolicy`;
- `batched`: the flows on threads, all in flight, their calls decoded together by
  `BatchingPolicy` with sharing of identical greedy calls OFF, so both headline arms decode
  every call (the count of shared calls in them is printed, and is 0);
- `batched_sharing`: as `batched`, with identical greedy calls in flight decoded once and shared
  (`share_greedy_calls=True`, the training default). The group's rollouts ask the greedy engine
  the same query analysis at once, so some calls are shared even when the planner samples.
  Compared with `batched`, not with `sequential`: it is what sharing saves, with its count.

Each arm counts its calls and their completion tokens as the callers got them, so a reader sees
that the headline arms decoded the same work (with no call shared, every token delivered was
decoded); forward hooks on the model count the rows of one-token forwards beside it.

After an untimed warm-up of each arm on one question, the arms run `--repeats` times (3), the
order reversed every other repeat; the figures are the median pair ratios with their min-max
range. Writes bench/results/rollouts[_tiny].json; the last line printed is
`batched_over_sequential=<median> shared_calls=<shared calls in the headline arms>`.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import torch
from measure import (
    RESULTS,
    alternate,
    check_repeats,
    figure_line,
    headline,
    provenance,
    ratios,
    spread,
    write_result,
)

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.chat import HFChatModel
from flowlearn.engine.local import HFPolicy
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS
from flowlearn.nodes.tools import default_tools
from flowlearn.training import collect

QUESTIONS = [
    "What is 17 * 23?",
    "What is the capital of France?",
    "What is 128 + 256?",
    "Who wrote Hamlet?",
]
GROUP = 4


class ForwardProbe:
    """Rows and seconds of each forward pass of a model, from torch hooks outside the policy.

    A forward over one new token per row is a decoding step (its rows are tokens decoded); any
    other reads prompts.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.rows: list[int] = []
        self.seconds = {"reading": 0.0, "decoding": 0.0}
        self._started = 0.0
        self._hooks = [
            model.register_forward_pre_hook(self._before, with_kwargs=True),
            model.register_forward_hook(self._after, with_kwargs=True),
        ]

    def _before(self, module: Any, args: Any, kwargs: Any) -> None:
        self._started = time.perf_counter()

    def _after(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        ids = kwargs["input_ids"]
        kind = "decoding" if ids.shape[1] == 1 else "reading"
        self.seconds[kind] += time.perf_counter() - self._started
        if kind == "decoding":
            self.rows.append(int(ids.shape[0]))

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()


class Arm:
    """One way to run the flows; `once()` runs them all and returns the seconds taken."""

    def __init__(self, name: str, policy: HFPolicy, cases: list[Case], args: argparse.Namespace):
        self.name, self.policy, self.cases, self.args = name, policy, cases, args
        self.runs: list[dict[str, Any]] = []

    def context(self) -> Context:
        return Context(
            max_turns=self.args.max_turns,
            planner_temperature=self.args.temperature,
            planner_max_new_tokens=self.args.tokens,
            seed=0,
            max_seconds=None,
            query_analysis=True,  # an engine call every rollout makes, as the default AgentFlow
        )

    def run(self, cases: list[Case]) -> dict[str, Any]:
        batching = self.name != "sequential"
        policy: HFPolicy | BatchingPolicy = (
            BatchingPolicy(
                self.policy,
                max_batch_size=len(cases) * self.args.group,
                max_wait_s=self.args.max_wait,
                share_greedy_calls=self.name == "batched_sharing",
            )
            if batching
            else self.policy
        )
        delivered: list[int] = []  # completion tokens of each call, as its caller got them
        decode = policy.generate

        def counted(*args: Any, **kwargs: Any) -> Any:
            generation = decode(*args, **kwargs)
            delivered.append(len(generation.completion_ids))
            return generation

        # on this instance, for this run, before the graph is built: the planner binds
        # `policy.generate` when it is built, the engine looks it up at each call
        policy.generate = counted  # type: ignore[method-assign]
        # every call's budget is the bench's: the engine roles' own (up to 1,024 tokens) would
        # otherwise run a model that never ends its replies, a random one, to them
        tokens = self.args.tokens
        engine = HFChatModel(policy=policy, max_new_tokens=tokens, fixed_max_new_tokens=tokens)
        graph = build_agentflow(policy, engine, default_tools(engine), prompts=AGENTFLOW_PROMPTS)
        probe = ForwardProbe(self.policy.handle.model)
        began = time.perf_counter()
        try:
            trajectories = collect(
                graph,
                cases,
                lambda answer, case: Score(0.0, "throughput only"),
                group_size=self.args.group,
                concurrency=len(cases) * self.args.group if batching else 1,
                context=self.context(),
                progress=False,
            )
        finally:
            seconds = time.perf_counter() - began
            probe.remove()
            del policy.generate  # type: ignore[method-assign]
            if isinstance(policy, BatchingPolicy):
                policy.close()
        planner = [t for r in trajectories for t in r.transitions if t["node"] == "planner"]
        return {
            "seconds": seconds,
            "trajectories": len(trajectories),
            "calls": len(delivered),
            "completion_tokens": sum(delivered),
            "decoding_forward_rows": sum(probe.rows),
            "decoding_forwards": len(probe.rows),
            "mean_rows_per_decoding_forward": sum(probe.rows) / max(len(probe.rows), 1),
            "seconds_reading_prompts": probe.seconds["reading"],
            "seconds_decoding": probe.seconds["decoding"],
            "shared_calls": policy.shared_calls.shared if isinstance(policy, BatchingPolicy) else 0,
            "planner_calls": len(planner),
            "planner_completions": [list(t.get("completion_ids") or []) for t in planner],
            "engine_budgets_spent": sorted(
                {
                    int(spent)
                    for r in trajectories
                    for t in r.transitions
                    for note in t.get("notes") or []
                    for spent in re.findall(r"engine budget spent: (\d+) tokens", note)
                }
            ),
        }

    def warm_up(self) -> float:
        self.run(self.cases[:1])
        return 0.0

    def once(self) -> float:
        self.runs.append(self.run(self.cases))
        return float(self.runs[-1]["seconds"])


def load(args: argparse.Namespace) -> HFPolicy:
    if not args.tiny:
        return HFPolicy.from_pretrained(args.planner, device=args.device)
    from gpu_checks import TINY, model, tokenizer

    tok = tokenizer(args.work / "tokenizer")
    return HFPolicy(model(TINY, tok, "cpu", torch.float32), tok, version="tiny-qwen2-random")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random Qwen2 on CPU")
    parser.add_argument("--flows", type=int, default=8, help="concurrent flows, 4 a question (8)")
    parser.add_argument("--planner", help="model (default: the embedded SmolLM2-135M)")
    parser.add_argument("--device", help="cpu or cuda (default: CUDA when available)")
    parser.add_argument("--max-turns", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=48, help="new tokens per model call (48)")
    parser.add_argument(
        "--temperature", type=float, default=0.7, help="the planner's (training's 0.7)"
    )
    parser.add_argument("--max-wait", type=float, default=0.05, help="batching wait, seconds")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of each arm (3)")
    parser.add_argument("--out", type=Path, help="JSON path (bench/results/rollouts[_tiny].json)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/flowlearn-rollouts-bench"))
    args = parser.parse_args(argv)
    check_repeats(args.repeats)
    args.group = min(GROUP, args.flows)  # rollouts a question
    if args.flows < 1 or args.flows % args.group:
        parser.error(f"--flows must be 1-{GROUP} or a multiple of {GROUP} (rollouts a question)")
    if args.tiny and (args.planner or args.device not in (None, "cpu")):
        parser.error("--tiny builds its own model on CPU: drop --planner and --device")
    args.out = args.out or RESULTS / ("rollouts_tiny.json" if args.tiny else "rollouts.json")
    return args


def compare(policy: HFPolicy, args: argparse.Namespace) -> dict[str, Any]:
    """Warm up, then time the three arms `args.repeats` times in alternating order; the figures."""
    cases = [
        Case(f"q{i}", QUESTIONS[i % len(QUESTIONS)], "") for i in range(args.flows // args.group)
    ]
    names = ("sequential", "batched", "batched_sharing")
    arms = {name: Arm(name, policy, cases, args) for name in names}
    print(f"{args.flows} flows, {args.repeats} repeats of {', '.join(arms)} ...", flush=True)
    for arm in arms.values():  # untimed, on one question
        arm.warm_up()

    def report(repeat: int, seconds: dict[str, float]) -> None:
        print(f"  repeat {repeat + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))

    seconds = alternate({n: a.once for n, a in arms.items()}, args.repeats, False, report)
    result: dict[str, Any] = {}
    for name, arm in arms.items():
        result[name] = {
            "seconds": spread(seconds[name]),
            "repeats": [
                {k: v for k, v in run.items() if k != "planner_completions"} for run in arm.runs
            ],
        }
    headline = arms["sequential"].runs + arms["batched"].runs
    same = [
        a["planner_completions"] == b["planner_completions"]
        for a, b in zip(arms["sequential"].runs, arms["batched"].runs, strict=True)
    ]
    return result | {
        "batched_over_sequential": ratios(seconds["sequential"], seconds["batched"]),
        "sharing_over_batched": ratios(seconds["batched"], seconds["batched_sharing"]),
        "shared_calls_headline_arms": sum(run["shared_calls"] for run in headline),
        "shared_calls_per_sharing_run": [
            run["shared_calls"] for run in arms["batched_sharing"].runs
        ],
        "completion_tokens": {
            n: [run["completion_tokens"] for run in a.runs] for n, a in arms.items()
        },
        "decoding_forward_rows": {
            n: [run["decoding_forward_rows"] for run in a.runs] for n, a in arms.items()
        },
        "same_planner_completions_in_headline_arms": same,
        "engine_budgets_spent": sorted(
            {b for a in arms.values() for run in a.runs for b in run["engine_budgets_spent"]}
        ),
    }


def headlines(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The published figures: batching's speed-up on equal work, and what sharing adds."""
    settings = result["settings"]
    what = (
        f"{settings['flows']} flows ({settings['group']} a question, planner at T="
        f"{settings['planner_temperature']}, {settings['tokens_per_call']} tokens a call), "
        f"{result['model']}"
    )
    shared = result["shared_calls_per_sharing_run"]
    return [
        headline(
            "rollouts, batched over one at a time",
            result["batched_over_sequential"],
            "x",
            f"{what}: all in flight with batched decoding vs one at a time, the same calls "
            f"decoded in both (no call shared: {result['shared_calls_headline_arms']})",
        ),
        headline(
            "rollouts, sharing identical greedy calls",
            result["sharing_over_batched"],
            "x",
            f"{what}: batched with identical greedy engine calls shared ({min(shared)}-"
            f"{max(shared)} of a repeat's calls) vs batched without",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    policy = load(args)
    result: dict[str, Any] = provenance("rollouts.py", argv) | {
        "model": policy.version,
        "prompt_set": AGENTFLOW_PROMPTS.name,
        "settings": {
            "flows": args.flows,
            "group": args.group,
            "max_turns": args.max_turns,
            "tokens_per_call": args.tokens,
            "planner_temperature": args.temperature,
            "max_wait_s": args.max_wait,
            "repeats": args.repeats,
        },
    }
    result |= compare(policy, args)
    result["headlines"] = headlines(result)
    write_result(args.out, result)
    headline, sharing = result["batched_over_sequential"], result["sharing_over_batched"]
    print(
        "completion tokens of every call a repeat (a shared call's counted once a caller): "
        + ", ".join(f"{name} {values}" for name, values in result["completion_tokens"].items())
        + "; planner completions the same in both headline arms: "
        + str(result["same_planner_completions_in_headline_arms"])
    )
    shared = result["shared_calls_per_sharing_run"]
    print(figure_line("sharing_over_batched", sharing, shared_calls_a_run=shared))
    print(figure_line("batched_over_sequential", headline) + f"; wrote {args.out}")
    print(
        f"batched_over_sequential={headline['median']:.3f} "
        f"shared_calls={result['shared_calls_headline_arms']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
