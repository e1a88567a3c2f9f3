"""Rollouts: G per question through the flow, rewarded and stored; the trainer's two sources.

`collect` runs and rewards them, resumably (a rollout's id is fixed). `FlowGRPOTrainer.online`
builds `Rollouts` (G rollouts per question through a graph around the live policy, rewarded by
a scorer); `FlowGRPOTrainer.offline` builds `Replay` (exported, rewarded trajectories, grouped
by question). Either gives the trainer its questions and, per step, the trajectories of the
questions TRL sampled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from flowlearn.engine.adapters import NodeSampling, PolicyRef, by_node, mixed_batching
from flowlearn.engine.batching import BatchingPolicy
from flowlearn.engine.local import HFPolicy
from flowlearn.engine.protocol import NodeBinding, Policy
from flowlearn.evals.cases import Case
from flowlearn.evals.runner import run_resumable
from flowlearn.evals.scorers import CaseScorer
from flowlearn.graphs.agentflow import build_agentflow
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts
from flowlearn.nodes.schema.context import Context
from flowlearn.secrets import error_text
from flowlearn.training.trajectories import (
    DROPPED,
    Trajectory,
    TrajectoryStore,
    check_trajectories,
    trajectory_from_state,
)

RewardTerm = Callable[[Trajectory], float]


@runtime_checkable
class RolloutScorer(Protocol):
    """An outcome reward that reads the whole rollout, not only its answer.

    `flowlearn.training.rewards.RewardFunctions` (TRL's reward functions) is one.
    """

    def score_rollout(self, trajectory: Trajectory, case: Case) -> tuple[float, str]:
        """Return the outcome reward (any finite number) and why; raise to mark an error."""
        ...


Outcome = CaseScorer | RolloutScorer
"""What rewards a rollout: `(answer, case) -> Score`, or a `RolloutScorer`."""
REWARD_ERROR_POLICIES = ("zero", "drop")


def step_concurrency(concurrency: int | None, questions: int, group_size: int) -> int:
    """Return the rollouts in flight at once: `concurrency`, or by default the step's own.

    The default is every rollout of the step (questions x G, TRL's generation batch), so
    their planner calls decode in one batch as TRL's `generate` does. A fixed 16 once kept a
    GPU step of 32 rollouts at 0.17 of TRL's tokens per second (`bench/gpu_train.py`).
    """
    return concurrency if concurrency is not None else max(questions * group_size, 1)


def format_penalty(weight: float = 0.1, nodes: Sequence[str] = ("planner",)) -> RewardTerm:
    """Return a reward term of `-weight` times the share of `nodes`' calls that did not parse.

    Training passes its trained nodes: a trained verifier's reply with no clear verdict means
    CONTINUE, so without its calls counted it could say CONTINUE by writing anything.
    """
    named = frozenset(nodes)

    def penalty(trajectory: Trajectory) -> float:
        calls = [t for t in trajectory.transitions if t["node"] in named]
        bad = sum(t["parse_status"] != "ok" for t in calls)
        return -weight * bad / len(calls) if calls else 0.0

    return penalty


def new_run_id() -> str:
    """Return a fresh run id: 12 hex digits, unique enough for every run a folder will see."""
    return uuid.uuid4().hex[:12]


def rollout_id(case: Case, index: int, prefix: str = "", run_id: str | None = None) -> str:
    """Return the id of rollout `index` of `case`; being fixed, it makes collection resumable.

    A training rollout is `step{k}:{case}/{i}@{run_id}`: the run id keeps one run's stored
    rollouts from ever being taken for another's.
    """
    return f"{prefix}{case.id}/{index}" + (f"@{run_id}" if run_id else "")


def collect(
    graph_factory: Any,
    cases: Sequence[Case],
    scorer: Outcome,
    *,
    group_size: int,
    store: TrajectoryStore | None = None,
    concurrency: int = 4,
    context: Any = None,
    extra_rewards: Mapping[str, RewardTerm] | None = None,
    progress: bool = True,
    id_prefix: str = "",
    reward_errors: str = "zero",
    run_id: str | None = None,
) -> list[Trajectory]:
    """Run `group_size` rollouts of every case, reward each, and append them to `store`.

    Args:
        graph_factory: a compiled graph, or a zero-argument function returning one.
        cases: questions with references; their ids become the `group_id`s.
        scorer: `(answer, case) -> Score`; its value is the trajectory's `reward`.
        group_size: G, the rollouts per question.
        store: where finished trajectories go; rollouts already in it are not run again.
        concurrency: rollouts in flight at once (threads).
        context: the graph's `Context`; with a `seed`, rollout k of a group uses `seed + k`.
        extra_rewards: named reward terms kept in `reward_terms`, e.g. `format_penalty()`.
        progress: show a tqdm progress bar.
        id_prefix: prepended to trajectory ids, e.g. the training step, so a question seen
            again in a later step gets fresh rollouts.
        reward_errors: what a failed scorer or reward term means for the returned list:
            `zero` keeps the trajectory with reward 0, `drop` leaves it out (training then
            never sees it). Either way it is stored, marked with `reward_error`.
        run_id: the training run's id, appended to trajectory ids and kept in `metadata`.

    Returns the trajectories of `cases`, stored ones included, in case and rollout order.
    A scorer or reward-term failure is recorded on the trajectory (reward 0), never raised;
    a crashed rollout is logged and left out, and the next `collect` retries it.

    """
    _check_collect(cases, group_size, reward_errors)
    graph = graph_factory if hasattr(graph_factory, "invoke") else graph_factory()
    stored = {t.trajectory_id: t for t in store} if store is not None else {}
    work = {
        rollout_id(case, k, id_prefix, run_id): (case, k)
        for case in cases
        for k in range(group_size)
    }

    def run_one(item: tuple[Case, int]) -> Trajectory:
        case, k = item
        return run_rollout(graph, case, k, scorer, context, extra_rewards, id_prefix, run_id)

    fresh = run_resumable(
        work,
        run_one,
        done=stored,
        save=store.append if store is not None else None,
        concurrency=concurrency,
        progress=progress,
        label="rollouts",
        unit="traj",
    )
    merged = {**stored, **fresh}
    return [
        merged[rid]
        for rid in work
        if rid in merged and not (reward_errors == "drop" and merged[rid].reward_error is not None)
    ]


def _check_collect(cases: Sequence[Case], group_size: int, reward_errors: str) -> None:
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if reward_errors not in REWARD_ERROR_POLICIES:
        raise ValueError(
            f"unknown reward_errors {reward_errors!r}; use one of {REWARD_ERROR_POLICIES}"
        )
    ids = [case.id for case in cases]
    if len(set(ids)) != len(ids):
        raise ValueError("case ids must be unique: they are the GRPO group ids")
    empty = [case.id for case in cases if not str(case.query).strip()]
    if empty:
        raise ValueError(
            f"cases {empty[:10]} have an empty query; give each a question or remove it"
        )


def run_rollout(
    graph: Any,
    case: Case,
    k: int,
    scorer: Outcome,
    context: Any = None,
    extra_rewards: Mapping[str, RewardTerm] | None = None,
    id_prefix: str = "",
    run_id: str | None = None,
) -> Trajectory:
    """Run rollout `k` of `case` through the graph and reward it (not stored)."""
    run_context = context
    if context is not None and getattr(context, "seed", None) is not None:
        run_context = dataclasses.replace(context, seed=context.seed + k)
    start = time.perf_counter()
    state = graph.invoke({"question": case.query}, context=run_context)
    metadata = {"case_metadata": case.metadata, "wall_seconds": time.perf_counter() - start}
    trajectory = trajectory_from_state(
        state,
        trajectory_id=rollout_id(case, k, id_prefix, run_id),
        group_id=case.id,
        reference=case.reference,
        context=run_context.to_dict() if hasattr(run_context, "to_dict") else {},
        metadata={**metadata, "run_id": run_id} if run_id else metadata,
    )
    reward(trajectory, case, scorer, extra_rewards or {})
    return trajectory


def reward(
    trajectory: Trajectory,
    case: Case,
    scorer: Outcome,
    extra: Mapping[str, RewardTerm],
) -> None:
    """Score the trajectory's answer into `reward`, and each extra term into `reward_terms`."""
    try:
        if isinstance(scorer, RolloutScorer):
            trajectory.reward, trajectory.reward_reason = scorer.score_rollout(trajectory, case)
        else:
            score = scorer(trajectory.answer, case)
            trajectory.reward, trajectory.reward_reason = score.value, score.reason
    except Exception as exc:  # a failing judge marks the trajectory; it never stops collection
        trajectory.reward, trajectory.reward_error = 0.0, error_text(exc)
    for name, term in extra.items():
        try:
            trajectory.reward_terms[name] = float(term(trajectory))
        except Exception as exc:
            trajectory.reward_terms[name] = 0.0
            trajectory.reward_error = f"{name}: {error_text(exc)}"


def unused_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
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


@dataclass
class Rollouts:
    """Online source: G rollouts per question through a graph around the live policy."""

    graph_factory: Callable[[Policy], Any]
    """From the live policy to a compiled graph whose policy calls append `transitions`.
    Called once, at the first step, with a `PolicyRef` that each step swaps its policy into."""
    scorer: Outcome
    """`(answer, case) -> Score`, the outcome reward."""
    cases: Sequence[Case]
    """The training questions."""
    extra_rewards: Mapping[str, RewardTerm] | None = None
    """Named reward terms added to the outcome (e.g. `format_penalty()`)."""
    store: TrajectoryStore | None = None
    """Where every rollout is also appended; under `accelerate launch`, one file per rank."""
    concurrency: int | None = None
    """Rollouts in flight at once; their planner calls are decoded together in batches.
    None: every rollout of the step (questions x G), as TRL generates its batch."""
    reward_errors: str = "zero"
    """A rollout whose scorer failed trains with reward 0 (`zero`) or is left out (`drop`)."""
    run_id: str | None = field(default_factory=new_run_id)
    """The training run's id, in every rollout's id and metadata; fresh per source unless set
    (`training.run.train` sets the one persisted in output_dir, kept on resume)."""
    _idle: list[tuple[PolicyRef, Any]] = field(default_factory=list, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
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
        policy: Policy | NodeBinding,
        cases: list[Case],
        *,
        group_size: int,
        context: Context,
        step: int,
        rank: int,
        progress: bool = False,
    ) -> list[Trajectory]:
        """Roll each case out `group_size` times with `policy` as the planner, and reward it.

        `policy`, batched for the step's rollouts (`batched`), is swapped into the graph built
        at the first step (`graph_around`). `progress` shows the step's rollouts finishing on
        a tqdm bar (the trainer's main process does, unless TRL's `disable_tqdm`).

        Under `reward_errors="drop"` a rollout whose reward failed comes back marked
        `metadata[DROPPED]`, so the batch leaves it out and counts it in the metrics. So does
        one a model call ended (`termination` "engine_error": a server that failed or timed
        out, its error recorded): its outcome says how the infrastructure fared, not how the
        policy chose, so none of its turns is trained on.
        """
        concurrency = step_concurrency(self.concurrency, len(cases), group_size)
        live = batched(policy, concurrency)
        seed = getattr(context, "seed", None)  # a test's stand-in may pass no context
        if seed is not None:  # each step draws afresh; a rerun or resume draws alike
            context = dataclasses.replace(context, seed=step_seed(seed, step, rank))
        with self.graph_around(live) as graph:
            trajectories = collect(
                graph,
                cases,
                self.scorer,
                group_size=group_size,
                store=rank_store(self.store, rank),
                context=context,
                concurrency=concurrency,
                progress=progress,
                extra_rewards=self.extra_rewards,
                id_prefix=f"step{step}:",
                run_id=self.run_id,
            )
        for trajectory in trajectories:
            if self.reward_errors == "drop" and trajectory.reward_error is not None:
                trajectory.metadata[DROPPED] = f"reward error: {trajectory.reward_error}"
            elif trajectory.termination == "engine_error":
                trajectory.metadata[DROPPED] = "a model call failed (termination engine_error)"
        return trajectories

    @contextlib.contextmanager
    def graph_around(self, policy: Any) -> Iterator[Any]:
        """Lend a step the graph, its `PolicyRef` holding `policy` until the step ends.

        The graph is built once, at the first step (`graph_factory`), and kept; each later
        step swaps its policy in rather than building the graph anew. A step run while
        another is (an evaluation beside the asynchronous producer's step) gets a graph of its
        own, so neither's swap reaches the other's calls.
        """
        with self._lock:
            idle = self._idle.pop() if self._idle else None
        if idle is None:
            ref = PolicyRef(policy)
            idle = ref, self.graph_factory(ref)
        ref, graph = idle
        try:
            ref.swap(policy)
            yield graph
        finally:
            ref.release()  # no step's model is kept alive by the graph between steps
            with self._lock:
                self._idle.append(idle)


def step_seed(seed: int, step: int, rank: int = 0) -> int:
    """Return the seed of a training step's rollouts on one process (`rank`).

    A blake2b digest of the three, as `Sampling.for_call` derives a call's seed (the same in
    every process, unlike Python's salted `hash`): each step and rank draws afresh, and rollout k
    adds k, so no two (step, rank, rollout) of a group share a seed but by a 2**-62 chance.
    """
    digest = hashlib.blake2b(f"{seed}:{step}:{rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 2


def batched(policy: Any, concurrency: int) -> Any:
    """Return `policy` decoding its concurrent calls together (`BatchingPolicy`), when local.

    The trained nodes of a local binding (`NodePolicies`) share one batch of mixed adapters
    (`mixed_batching`); a server batches its own.
    """
    if concurrency <= 1:
        return policy
    nodes = by_node(policy)
    if nodes.trained:
        # Only a local model's adapters batch here; `mixed_batching` builds on its handle.
        return mixed_batching(nodes, concurrency) if isinstance(nodes.base, HFPolicy) else policy
    if isinstance(policy, NodeSampling):  # a node's own sampling, over what it wraps batched
        return dataclasses.replace(policy, wrapped=batched(policy.wrapped, concurrency))
    # A local model's single calls batch here; a server batches its own, a chat model cannot.
    return BatchingPolicy(policy, concurrency) if isinstance(policy, HFPolicy) else policy


def agentflow_factory(
    engine: BaseChatModel, tools: Sequence[BaseTool], prompts: Prompts = AGENTFLOW_PROMPTS
) -> Callable[[Policy], Any]:
    """Return a function from the live policy to the AgentFlow graph with `prompts`.

    The planner plans with its node's policy (the base's when untrained, or the one policy),
    and a verifier or executor trained apart (`NodePolicies`, `PolicyRef`) runs on its own.
    """
    bound = list(tools)

    def factory(policy: Any) -> Any:
        nodes = by_node(policy)
        return build_agentflow(
            nodes.for_node("planner"),
            engine,
            bound,
            prompts=prompts,
            verifier_policy=nodes.trained.get("verifier"),
            executor_policy=nodes.trained.get("executor"),
        )

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
        """Group `trajectories` by their question.

        Raises:
            DataError: a trajectory whose reward, reward term or logprob is not finite.

        """
        check_trajectories(trajectories)  # however they were built, before any update
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
