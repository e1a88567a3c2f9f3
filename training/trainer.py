"""FlowGRPOTrainer: Flow-GRPO on TRL's GRPOTrainer, with rollouts through the LangGraph flow.

Why it is built this way:
1. TRL's stock path assumes one completion per row in contiguous groups of G. A flow rollout
   yields a variable number of planner turns, so `_generate_and_score_completions` is
   overridden: it runs G rollouts per question through the real graph with the model being
   trained as the planner, rewards them, builds Flow-GRPO rows and pads them into the tensors
   TRL's loss reads. TRL keeps the clipped-ratio loss, the KL, the optimizer, logging and
   checkpoints.
2. The logged logprobs are the old policy's (`old_per_token_logps`): they were sampled at the
   planner temperature, which must equal TRL's `temperature` (checked), so the first ratio is 1
   up to numerics, and offline data gets its importance correction for free.
3. Rollouts of step k+1 see the weights updated at step k: the policy wraps the live model.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import Score
from flowlearn.graphs.agentflow import build_agentflow
from flowlearn.nodes.batching import BatchingPolicy
from flowlearn.nodes.hf_policy import HFPolicy
from flowlearn.nodes.policy import Policy
from flowlearn.nodes.schema.context import Context
from flowlearn.training.collect import collect
from flowlearn.training.flow_grpo import Mode, Scale, StepCredit, build_flow_grpo_rows
from flowlearn.training.metrics import FlowMetricsCallback
from flowlearn.training.store import TrajectoryStore
from flowlearn.training.tensors import rows_to_tensors
from flowlearn.training.trajectory import Trajectory

logger = logging.getLogger(__name__)


def unused_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """Satisfy GRPOTrainer's constructor; Flow-GRPO rewards come from the flow's scorer."""
    raise RuntimeError("FlowGRPOTrainer computes rewards from rollouts; this is never called")


def _no_scorer(answer: str, case: Case) -> Score:
    raise RuntimeError("offline training has no scorer: rewards come with the trajectories")


def cases_dataset(cases: Sequence[Case]) -> Any:
    """Return a `datasets.Dataset` with TRL's `prompt` column and each case as JSON."""
    import datasets

    return datasets.Dataset.from_list(
        [
            {"prompt": case.query, "case": json.dumps(dataclasses.asdict(case), default=str)}
            for case in cases
        ]
    )


class FlowGRPOTrainer(GRPOTrainer):
    """Train the planner with Flow-GRPO, online through the flow or offline from trajectories."""

    def __init__(
        self,
        model: Any,
        *,
        args: GRPOConfig,
        engine: Any = None,
        tools: Sequence[Any] = (),
        graph_factory: Callable[[Policy], Any] | None = None,
        nodes: Sequence[str] | None = None,
        scorer: Callable[[str, Case], Score] | None = None,
        cases: Sequence[Case] = (),
        trajectories: Sequence[Trajectory] | None = None,
        context: Context | None = None,
        mode: Mode = "paper",
        scale: Scale = "group",
        drop_zero_variance: bool = False,
        step_credit: StepCredit | None = None,
        extra_rewards: dict[str, Callable[[Trajectory], float]] | None = None,
        rollout_store: TrajectoryStore | None = None,
        rollout_concurrency: int = 16,
        reward_errors: str = "zero",
        **kwargs: Any,
    ) -> None:
        """Set up online training (cases, scorer and a flow) or offline (trajectories).

        Args:
            model: the policy to train (a transformers model, or a PeftModel for LoRA).
            args: TRL's config; `temperature` must equal the planner temperature of `context`.
            engine: the fixed chat model of the default AgentFlow graph.
            tools: the tools of the default AgentFlow graph.
            graph_factory: instead of engine and tools, any graph: a function from the live
                policy to a compiled graph whose nodes append policy calls to `transitions`
                (see `flowlearn.nodes.policy_transition`).
            nodes: which nodes' transitions become rows; None: every transition that carries
                token ids, i.e. every call of the policy being trained.
            scorer: `(answer, case) -> Score`, the outcome reward.
            cases: the training questions (online mode).
            trajectories: exported, rewarded trajectories (offline mode).
            context: the graph's run context (budget, planner sampling).
            mode: the Flow-GRPO weighting mode (`build_flow_grpo_rows`).
            scale: the advantage scaling (`build_flow_grpo_rows`).
            drop_zero_variance: drop groups whose rewards are all equal.
            step_credit: optional GiGPO-style step credit.
            extra_rewards: named reward terms added to the outcome (e.g. `format_penalty()`).
            rollout_store: where every rollout is also appended, for inspection or reuse.
            reward_errors: a rollout whose scorer failed trains with reward 0 (`zero`) or
                is left out (`drop`); it is stored and marked either way.
            rollout_concurrency: rollouts in flight at once; their planner calls are decoded
                together in batches of up to this size (`BatchingPolicy`); 1 runs them in turn.
            **kwargs: passed to `GRPOTrainer` (e.g. `processing_class`, `callbacks`).

        Raises:
            ValueError: neither or both sources, or sampling settings that disagree.

        """
        self.flow_context = context or Context(max_turns=3)
        if (trajectories is None) == (not cases):
            raise ValueError(
                "give cases (online: rollouts through the flow) or trajectories "
                "(offline: from an exported file), not both"
            )
        if args.temperature != self.flow_context.planner_temperature:
            raise ValueError(
                f"TRL temperature {args.temperature} differs from the planner temperature "
                f"{self.flow_context.planner_temperature}: the logged logprobs would not be the "
                "old policy's; set both to the same value"
            )
        if args.loss_type != "dapo":
            raise ValueError(
                "FlowGRPOTrainer needs loss_type='dapo': the Flow-GRPO weighting "
                "mode ('paper', 'official', 'sequence') sets the normalisation"
            )
        if args.gradient_accumulation_steps != 1 or args.steps_per_generation != 1:
            raise ValueError(
                "set gradient_accumulation_steps=1 and steps_per_generation=1: one "
                "generation batch is one update, as in the paper"
            )
        self.engine, self.flow_tools = engine, list(tools)
        self.graph_factory = graph_factory or self._agentflow
        self.nodes = nodes
        self.scorer: Callable[[str, Case], Score] = scorer or _no_scorer
        self.mode, self.scale, self.drop_zero_variance = mode, scale, drop_zero_variance
        self.rollout_store = rollout_store
        if rollout_concurrency < 1:
            raise ValueError(f"rollout_concurrency must be >= 1, got {rollout_concurrency}")
        self.rollout_concurrency = rollout_concurrency
        self.reward_errors = reward_errors
        self.step_credit = step_credit
        self.extra_rewards = extra_rewards
        self.offline: dict[str, list[Trajectory]] = {}
        if trajectories is not None:
            for trajectory in trajectories:
                self.offline.setdefault(trajectory.group_id, []).append(trajectory)
            dataset = cases_dataset([Case(g, g, None) for g in sorted(self.offline)])
        else:
            if scorer is None:
                raise ValueError("online training needs a scorer for the rollouts' answers")
            if graph_factory is None and (engine is None or not tools):
                raise ValueError(
                    "online training needs a graph: give graph_factory, or engine and tools "
                    "for the default AgentFlow graph"
                )
            if graph_factory is not None and (engine is not None or tools):
                raise ValueError(
                    "give graph_factory or engine and tools, not both: the factory builds "
                    "the whole graph"
                )
            dataset = cases_dataset(cases)
        per_step = args.per_device_train_batch_size // max(int(args.num_generations or 1), 1)
        if len(dataset) < per_step:
            raise ValueError(
                f"each step takes {per_step} questions (batch {args.per_device_train_batch_size} "
                f"/ num_generations {args.num_generations}) but only {len(dataset)} "
                f"{'groups' if trajectories is not None else 'questions'} were given; lower "
                "questions_per_step or give more data"
            )
        reward_funcs: Any = [unused_reward]
        super().__init__(
            model=model, reward_funcs=reward_funcs, args=args, train_dataset=dataset, **kwargs
        )
        self.group_size = int(args.num_generations or 1)
        self.flow_args: GRPOConfig = args
        self.rollout_ended: float | None = None
        self.group_rewards: dict[str, float] = {}
        self.add_callback(FlowMetricsCallback(self))

    def rollout(self, cases: list[Case]) -> list[Trajectory]:
        """Run G rollouts per case with the live model as the planner."""
        model = self.accelerator.unwrap_model(self.model)
        policy: HFPolicy = HFPolicy(
            model, self.processing_class, version=f"{self.args.output_dir}@{self.state.global_step}"
        )
        if self.rollout_concurrency > 1:
            policy = BatchingPolicy(policy, max_batch_size=self.rollout_concurrency)
        graph = self.graph_factory(policy)
        was_training = model.training
        model.eval()
        try:
            return collect(
                graph,
                cases,
                self.scorer,
                group_size=self.group_size,
                store=self._rank_store(),
                context=self.flow_context,
                concurrency=self.rollout_concurrency,
                progress=False,
                extra_rewards=self.extra_rewards,
                id_prefix=f"step{self.state.global_step}:",
                reward_errors=self.reward_errors,
            )
        finally:
            model.train(was_training)

    def _rank_store(self) -> TrajectoryStore | None:
        """Return this process's rollout store: under `accelerate launch`, one file per rank.

        Each process rolls out its own questions; separate files keep appends from racing and
        let each rank resume its own step after a crash.
        """
        store, rank = self.rollout_store, self.accelerator.process_index
        if store is None or rank == 0:
            return store
        return TrajectoryStore(
            store.path.with_name(f"{store.path.stem}.rank{rank}{store.path.suffix}")
        )

    def _agentflow(self, policy: Policy) -> Any:
        return build_agentflow(policy, self.engine, self.flow_tools)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        started = time.perf_counter()
        seen: dict[str, Case] = {}
        for item in inputs:  # TRL repeats each prompt G times; we roll each question out G times
            case = Case(**json.loads(item["case"]))
            seen.setdefault(case.id, case)
        if self.offline:
            trajectories = [t for group in seen for t in self.offline[group]]
        else:
            trajectories = self.rollout(list(seen.values()))
        batch = build_flow_grpo_rows(
            trajectories,
            self.mode,
            nodes=self.nodes,
            scale=self.scale,
            drop_zero_variance=self.drop_zero_variance,
            max_completion_length=self.flow_args.max_completion_length,
            step_credit=self.step_credit,
        )
        if not batch.rows:
            logger.warning(
                "step %d has no rows to train on (%d rollouts, all dropped or without policy "
                "turns): its update is skipped",
                self.state.global_step,
                len(trajectories),
            )
        tokenizer: Any = self.processing_class
        output = rows_to_tensors(batch.rows, tokenizer.pad_token_id, self.accelerator.device)
        if self.beta != 0.0:
            output["ref_per_token_logps"] = self._reference_logps(output)
        self._log_flow_metrics(trajectories, batch.stats, time.perf_counter() - started)
        return output

    def compute_loss(
        self,
        model: Any,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        """TRL's loss, except a batch without trainable tokens, whose update is skipped.

        Its loss is a constant 0 that reaches no parameter, so no gradient is set and the
        optimizer (AdamW skips parameters without one) changes nothing: no momentum step,
        no weight decay. The step still counts, so the data order stays the same.
        """
        if int(inputs["completion_mask"].sum()) == 0 and self.accelerator.num_processes == 1:
            self._metrics["train"]["flow/skipped_update"].append(1.0)
            return torch.zeros((), device=self.accelerator.device, requires_grad=True)
        self._metrics["train"]["flow/skipped_update"].append(0.0)
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _log_flow_metrics(
        self, trajectories: list[Trajectory], stats: dict[str, Any], seconds: float
    ) -> None:
        live: Any = self.model
        metrics = self._metrics["train" if live.training else "eval"]
        for key in ("mean_reward", "zero_variance_share", "rows", "tokens", "mean_turns"):
            metrics[f"flow/{key}"].append(float(stats[key]))
        turns = [
            t
            for trajectory in trajectories
            for t in trajectory.transitions
            if t.get("completion_ids") is not None
        ]
        bad = sum(t["parse_status"] != "ok" for t in turns)
        metrics["flow/format_error_rate"].append(bad / len(turns) if turns else 0.0)
        metrics["flow/completion_length"].append(
            sum(len(t.get("completion_ids") or []) for t in turns) / len(turns) if turns else 0.0
        )
        metrics["flow/rollout_seconds"].append(seconds)
        groups: dict[str, list[float]] = {}
        for trajectory in trajectories:
            groups.setdefault(trajectory.group_id, []).append(trajectory.total_reward)
        self.group_rewards = {g: sum(r) / len(r) for g, r in groups.items()}
        self.rollout_ended = time.perf_counter()

    def _reference_logps(self, tensors: dict[str, Any]) -> Any:
        ids = torch.cat([tensors["prompt_ids"], tensors["completion_ids"]], dim=1)
        mask = torch.cat([tensors["prompt_mask"], tensors["completion_mask"]], dim=1)
        keep = tensors["completion_ids"].size(1)
        with torch.no_grad():
            if self.ref_model is not None:
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.ref_model, ids, mask, keep
                )
                return logps
            model = self.accelerator.unwrap_model(self.model)
            with model.disable_adapter():  # LoRA: the frozen base is the reference
                logps, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, mask, keep)
            return logps
