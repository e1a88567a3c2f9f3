"""Training rollouts with identical greedy engine calls shared, against each call decoded.

Both arms run the first round of examples/learn_tools.yaml as training does: the tool task's
first training questions, G rollouts each in flight at once, the embedded SmolLM2 as planner
(T=0.7, seeded alike in both arms) and as the greedy engine, one turn, the real tools, all on
one `BatchingPolicy`. The arms differ only in `share_greedy_calls`. The pair runs `--repeats`
times, the arms' order swapped each time. Prints each arm's seconds, the calls shared, and the
ratio of rollouts per second (shared over unshared), and checks that the engine's replies are
the same in both arms.

Run: `python bench/shared_calls.py [--questions 2] [--group 8] [--repeats 1]`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.chat import HFChatModel
from flowlearn.engine.local import HFPolicy
from flowlearn.evals.scorers import CaseScorer
from flowlearn.evals.tasks import load_cases_and_scorer
from flowlearn.evals.tool_task import CORPUS_FILE, TRAIN_FILE
from flowlearn.graphs import Context, build_agentflow
from flowlearn.nodes.tools import default_tools
from flowlearn.training.rollouts import collect

RESULTS = Path(__file__).parent / "results" / "shared_calls.json"


def run_arm(
    single: HFPolicy, share: bool, cases: list[Any], scorer: CaseScorer, group: int
) -> dict[str, Any]:
    """Collect one round of rollouts; return its seconds, shared calls and engine replies."""
    policy = BatchingPolicy(single, max_batch_size=16, share_greedy_calls=share)
    engine = HFChatModel(policy=policy)
    graph = build_agentflow(policy, engine, default_tools(engine, corpus=str(CORPUS_FILE)))
    context = Context(max_turns=1, planner_temperature=0.7, seed=0, query_analysis=True)
    start = time.perf_counter()
    rollouts = collect(
        graph,
        cases,
        scorer,
        group_size=group,
        concurrency=len(cases) * group,
        context=context,
        progress=False,
    )
    seconds = time.perf_counter() - start
    replies = [[t["output"] for t in r.transitions if t["node"] != "planner"] for r in rollouts]
    policy.close()
    return {
        "seconds": seconds,
        "shared": policy.shared_calls.shared,
        "rollouts": len(rollouts),
        "right": sum(r.reward for r in rollouts),
        "replies": replies,
    }


def main(questions: int, group: int, repeats: int) -> None:
    """Run the arms side by side and print their ratio."""
    cases, scorer = load_cases_and_scorer(data=TRAIN_FILE, scorer="exact_match")
    cases = cases[:questions]
    single = HFPolicy.from_pretrained(None)
    rows = []
    for repeat in range(repeats):
        order = (True, False) if repeat % 2 == 0 else (False, True)
        arms = {share: run_arm(single, share, cases, scorer, group) for share in order}
        on, off = arms[True], arms[False]
        same = sum(a == b for a, b in zip(on["replies"], off["replies"], strict=True))
        ratio = off["seconds"] / on["seconds"]
        print(
            f"repeat {repeat}: shared {on['seconds']:.0f} s ({on['shared']} calls shared, "
            f"{on['right']:.0f} right), unshared {off['seconds']:.0f} s ({off['right']:.0f} "
            f"right); rollouts/s ratio {ratio:.2f}; engine replies alike in {same}/"
            f"{on['rollouts']} rollouts",
            flush=True,
        )
        rows.append(
            {
                "shared_s": on["seconds"],
                "unshared_s": off["seconds"],
                "calls_shared": on["shared"],
                "ratio": ratio,
                "rollouts_alike": same,
                "rollouts": on["rollouts"],
            }
        )
    RESULTS.write_text(
        json.dumps({"questions": questions, "group": group, "runs": rows}, indent=2) + "\n"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    main(args.questions, args.group, args.repeats)
