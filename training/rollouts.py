"""Where a Flow-GRPO step's trajectories come from: rollouts through a graph, or a replayed file.

`FlowGRPOTrainer.online` builds `Rollouts` (G rollouts per question through a graph around the
live policy, rewarded by a scorer); `FlowGRPOTrainer.offline` builds `Replay` (exported,
rewarded trajectories, grouped by question). Either gives the trainer its questions and, per
step, the trajectories of the questions TRL sampled.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import CaseScorer
from flowlearn.graphs.agentflow import build_agentflow
from flowlearn.nodes.policies.batching import BatchingPolicy
from flowlearn.nodes.policies.hf import HFPolicy
from flowlearn.nodes.policies.protocol import Policy
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts
from flowlearn.nodes.schema.context import Context
from flowlearn.training.collect import REWARD_ERROR_POLICIES, RewardTerm, collect
from flowlearn.training.provenance import DROPPED
from flowlearn.training.run_record import new_run_id
from flowlearn.training.store import TrajectoryStore
from flowlearn.training.trajectory import Trajectory


def unused_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Satisfy GRPOTrainer's constructor; Flow-GRPO rewards come from the flow's scorer."""
    raise RuntimeError("FlowGRPOTrainer computes rewards from rollouts; this is never called")


def cases_dataset(cases: Sequence[Case]) -> Any:
    """Return a `datasets.Dataset` with TRL's `prompt` column and each case as JSON."""
    import datasets

    return datasets.Dataset.from_list(
        [
            {"prompt": case.query, "case": json.dumps(dataclasses.asdict(case), default=str)}
            for case in cases
        ]
    )


def sampled_cases(inputs: list[dict[str, Any]]) -> list[Case]:
    """Return the distinct cases of TRL's inputs (it repeats each prompt G times), in order."""
    seen: dict[str, Case] = {}
    for item in inputs:
        case = Case(**json.loads(item["case"]))
        seen.setdefault(case.id, case)
    return list(seen.values())


ROLLOUT_CONCURRENCY = 16
"""Rollouts in flight at once by default; the engine's calls are batched up to as many."""


@dataclass
class Rollouts:
    """Online source: G rollouts per question through a graph around the live policy."""

    graph_factory: Callable[[Policy], Any]
    """From the live policy to a compiled graph whose policy calls append `transitions`."""
    scorer: CaseScorer
    """`(answer, case) -> Score`, the outcome reward."""
    cases: Sequence[Case]
    """The training questions."""
    extra_rewards: Mapping[str, RewardTerm] | None = None
    """Named reward terms added to the outcome (e.g. `format_penalty()`)."""
    store: TrajectoryStore | None = None
    """Where every rollout is also appended; under `accelerate launch`, one file per rank."""
    concurrency: int = 16  # ROLLOUT_CONCURRENCY
    """Rollouts in flight at once; their planner calls are decoded together in batches."""
    reward_errors: str = "zero"
    """A rollout whose scorer failed trains with reward 0 (`zero`) or is left out (`drop`)."""
    run_id: str | None = field(default_factory=new_run_id)
    """The training run's id, in every rollout's id and metadata; fresh per source unless set
    (`training.run.train` sets the one persisted in output_dir, kept on resume)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"rollout_concurrency must be >= 1, got {self.concurrency}")
        if self.reward_errors not in REWARD_ERROR_POLICIES:
            raise ValueError(
                f"unknown reward_errors {self.reward_errors!r}; use one of {REWARD_ERROR_POLICIES}"
            )

    def questions(self) -> list[Case]:
        """Return the questions TRL samples from."""
        return list(self.cases)

    def run(
        self,
        policy: Policy,
        cases: list[Case],
        *,
        group_size: int,
        context: Context,
        step: int,
        rank: int,
    ) -> list[Trajectory]:
        """Roll each case out `group_size` times with `policy` as the planner, and reward it.

        Under `reward_errors="drop"` a rollout whose reward failed comes back marked
        `metadata[DROPPED]`, so the batch leaves it out and counts it in the metrics.
        """
        live: Policy = policy
        if self.concurrency > 1 and isinstance(policy, HFPolicy):  # a server batches its own
            live = BatchingPolicy(policy, max_batch_size=self.concurrency)
        trajectories = collect(
            self.graph_factory(live),
            cases,
            self.scorer,
            group_size=group_size,
            store=rank_store(self.store, rank),
            context=context,
            concurrency=self.concurrency,
            progress=False,
            extra_rewards=self.extra_rewards,
            id_prefix=f"step{step}:",
            run_id=self.run_id,
        )
        for trajectory in trajectories:
            if self.reward_errors == "drop" and trajectory.reward_error is not None:
                trajectory.metadata[DROPPED] = f"reward error: {trajectory.reward_error}"
        return trajectories


def agentflow_factory(
    engine: BaseChatModel, tools: Sequence[BaseTool], prompts: Prompts = AGENTFLOW_PROMPTS
) -> Callable[[Policy], Any]:
    """Return a function from the live policy to the AgentFlow graph with `prompts`."""
    bound = list(tools)

    def factory(policy: Policy) -> Any:
        return build_agentflow(policy, engine, bound, prompts=prompts)

    return factory


def rank_store(store: TrajectoryStore | None, rank: int) -> TrajectoryStore | None:
    """Return process `rank`'s rollout store: under `accelerate launch`, one file per rank.

    Each process rolls out its own questions; separate files keep appends from racing and let
    each rank resume its own step after a crash.
    """
    if store is None or rank == 0:
        return store
    return TrajectoryStore(store.path.with_name(f"{store.path.stem}.rank{rank}{store.path.suffix}"))


@dataclass
class Replay:
    """Offline source: exported, rewarded trajectories, grouped by question (`group_id`)."""

    groups: dict[str, list[Trajectory]] = field(default_factory=dict)

    @classmethod
    def of(cls, trajectories: Sequence[Trajectory]) -> Replay:
        """Group `trajectories` by their question."""
        replay = cls()
        for trajectory in trajectories:
            replay.groups.setdefault(trajectory.group_id, []).append(trajectory)
        return replay

    def questions(self) -> list[Case]:
        """Return one stand-in case per group, for TRL to sample from."""
        return [Case(g, g, None) for g in sorted(self.groups)]

    def run(self, cases: list[Case]) -> list[Trajectory]:
        """Return the stored trajectories of the sampled groups."""
        return [t for case in cases for t in self.groups[case.id]]
