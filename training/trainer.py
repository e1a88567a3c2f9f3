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
4. Two constructors, one per source: `online` (cases, a scorer and a graph) and `offline`
   (exported trajectories); `__init__` takes the source they build (`flowlearn.training.rollouts`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import CaseScorer
from flowlearn.nodes.policies.handle import ModelHandle
from flowlearn.nodes.policies.protocol import Policy
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts
from flowlearn.nodes.schema.context import Context
from flowlearn.training.collect import RewardTerm
from flowlearn.training.config import check_settings, context_from
from flowlearn.training.flow_grpo import Mode, Scale, StepCredit, build_flow_grpo_rows
from flowlearn.training.forward import recompute_old_logps, reference_logps
from flowlearn.training.layout import Batching, step_tensors
from flowlearn.training.live_policy import live_policy, warn_no_rows
from flowlearn.training.metrics import FlowMetricsCallback, flow_metrics
from flowlearn.training.micro import chunked_loss, next_piece
from flowlearn.training.model_setup import (
    frozen_reference,
    install_reference,
    reference_kept_from_trl,
    upcast_trainable,
    warn_on_dropout,
)
from flowlearn.training.rollouts import (
    ROLLOUT_CONCURRENCY,
    Replay,
    Rollouts,
    agentflow_factory,
    cases_dataset,
    sampled_cases,
    unused_reward,
)
from flowlearn.training.server_generation import ServerGeneration
from flowlearn.training.store import TrajectoryStore
from flowlearn.training.trajectory import Trajectory
from flowlearn.training.trl_vllm import VLLMFactory, VLLMRollouts, attach_vllm, vllm_kept_from_trl
from flowlearn.training.weights import check_mode

__all__ = ["FlowGRPOTrainer", "cases_dataset", "unused_reward"]


class FlowGRPOTrainer(GRPOTrainer):
    """Train the planner with Flow-GRPO, online through the flow or offline from trajectories."""

    def __init__(
        self,
        model: Any,
        *,
        args: GRPOConfig,
        source: Rollouts | Replay,
        context: Context | None = None,
        nodes: Sequence[str] | None = None,
        mode: Mode = "paper",
        drop_zero_variance: bool = False,
        step_credit: StepCredit | None = None,
        recompute_old_logprobs: bool | None = None,
        vllm: VLLMFactory | None = None,
        **kwargs: Any,
    ) -> None:
        """Set up training from `source`; `online` and `offline` build it.

        Args:
            model: the policy to train (a transformers model, or a PeftModel for LoRA).
            args: TRL's config (a `FlowGRPOConfig` or any `GRPOConfig`): `num_generations` is
                G, `scale_rewards` the advantage scaling, `temperature` the planner's.
            source: where each step's trajectories come from (`Rollouts` or `Replay`).
            context: the graph's run context (budget, planner sampling); default: 3 turns,
                sampling with TRL's `temperature`, `top_p` and `max_completion_length`.
            nodes: which nodes' transitions become rows; None: every transition that carries
                token ids, i.e. every call of the policy being trained.
            mode: the Flow-GRPO weighting mode (`build_flow_grpo_rows`).
            drop_zero_variance: drop groups whose rewards are all equal.
            step_credit: optional GiGPO-style step credit.
            recompute_old_logprobs: take the old logprobs from a no-grad training forward
                instead of the logged ones (verl's way); None: `args.recompute_old_logprobs`
                (a `FlowGRPOConfig`), else off.
            vllm: under `args.use_vllm`, builds the engine (`trl_vllm`); None: TRL's own.
            **kwargs: passed to `GRPOTrainer` (e.g. `processing_class`, `callbacks`).

        Raises:
            ValueError: settings that disagree, or fewer questions than one step takes.

        """
        self.flow_context = context or context_from(args)
        questions = source.questions()
        check_settings(args, self.flow_context, len(questions), offline=isinstance(source, Replay))
        self.source = source
        self.nodes = nodes
        self.model_handle: ModelHandle | None = None
        """The handle every policy over the trained model shares (set by `online`)."""
        self.server: ServerGeneration | None = None
        """Set by `online`: the planner samples on a vLLM server, the adapter pushed to it."""
        check_mode(mode)
        self.mode, self.drop_zero_variance, self.step_credit = mode, drop_zero_variance, step_credit
        recompute = recompute_old_logprobs
        if recompute is None:  # a FlowGRPOConfig's field; off for a plain GRPOConfig
            recompute = bool(getattr(args, "recompute_old_logprobs", False))
        self.recompute_old_logprobs = recompute
        reward_funcs: Any = [unused_reward]
        reference = frozen_reference(model, args.beta)  # before TRL patches it; as loaded
        upcast_trainable(model)  # fp32 master weights; bf16=True autocasts the compute
        warn_on_dropout(model, args.disable_dropout)
        with reference_kept_from_trl(args, reference), vllm_kept_from_trl(args):  # ours instead
            super().__init__(
                model=model,
                reward_funcs=reward_funcs,
                args=args,
                train_dataset=cases_dataset(questions),
                **kwargs,
            )
        install_reference(self, reference)
        self.vllm: VLLMRollouts | None = attach_vllm(self, vllm)  # under use_vllm
        self.group_size = int(args.num_generations or 1)
        self.flow_args: GRPOConfig = args
        self.rollout_ended: float | None = None
        self.group_rewards: dict[str, float] = {}
        self.add_callback(FlowMetricsCallback(self))

    @classmethod
    def online(
        cls,
        model: Any,
        *,
        args: GRPOConfig,
        cases: Sequence[Case],
        scorer: CaseScorer,
        engine: BaseChatModel | None = None,
        tools: Sequence[BaseTool] = (),
        prompts: Prompts = AGENTFLOW_PROMPTS,
        graph_factory: Callable[[Policy], Any] | None = None,
        extra_rewards: Mapping[str, RewardTerm] | None = None,
        rollout_store: TrajectoryStore | None = None,
        rollout_concurrency: int = ROLLOUT_CONCURRENCY,
        reward_errors: str = "zero",
        handle: ModelHandle | None = None,
        server: ServerGeneration | None = None,
        **kwargs: Any,
    ) -> FlowGRPOTrainer:
        """Train on rollouts through a graph with the live model as the planner.

        Args:
            model: the policy to train.
            args: TRL's config.
            cases: the training questions.
            scorer: `(answer, case) -> Score`, the outcome reward.
            engine: the fixed chat model of the default AgentFlow graph.
            tools: the tools of the default AgentFlow graph.
            prompts: what the default graph's nodes say to their models (`Prompts`).
            graph_factory: instead of engine and tools, any graph: a function from the live
                policy to a compiled graph whose nodes append policy calls to `transitions`
                (see `flowlearn.nodes.policy_transition`).
            extra_rewards: named reward terms added to the outcome (e.g. `format_penalty()`).
            rollout_store: where every rollout is also appended, for inspection or reuse.
            rollout_concurrency: rollouts in flight at once; their planner calls are decoded
                together in batches of up to this size (`BatchingPolicy`); 1 runs them in turn.
            reward_errors: a rollout whose scorer failed trains with reward 0 (`zero`) or is
                left out (`drop`); it is stored and marked either way.
            handle: the `ModelHandle` of `model` that other policies (e.g. the frozen base as
                engine) are built on, so the live planner shares their lock; None: a handle of
                the trainer's own.
            server: plan on a vLLM server instead, this step's LoRA adapter loaded into it.
            **kwargs: passed to `__init__` (`context`, `nodes`, `mode`, ...) and TRL.

        """
        if graph_factory is not None and (engine is not None or tools):
            raise ValueError(
                "give graph_factory or engine and tools, not both: the factory builds the "
                "whole graph"
            )
        if graph_factory is None:
            if engine is None or not tools:
                raise ValueError(
                    "online training needs a graph: give graph_factory, or engine and tools "
                    "for the default AgentFlow graph"
                )
            graph_factory = agentflow_factory(engine, tools, prompts)
        source = Rollouts(
            graph_factory,
            scorer,
            cases,
            extra_rewards=extra_rewards,
            store=rollout_store,
            concurrency=rollout_concurrency,
            reward_errors=reward_errors,
        )
        trainer = cls(model, args=args, source=source, **kwargs)
        trainer.model_handle, trainer.server = handle, server
        return trainer

    @classmethod
    def offline(
        cls, model: Any, *, args: GRPOConfig, trajectories: Sequence[Trajectory], **kwargs: Any
    ) -> FlowGRPOTrainer:
        """Train on exported, rewarded trajectories (importance-corrected by their logprobs).

        `kwargs` go to `__init__` (`context`, `nodes`, `mode`, ...) and TRL.
        """
        return cls(model, args=args, source=Replay.of(trajectories), **kwargs)

    def rollout(self, cases: list[Case]) -> list[Trajectory]:
        """Run G rollouts per case with the live model as the planner (online only)."""
        if not isinstance(self.source, Rollouts):
            raise TypeError("an offline trainer has no rollouts: it replays its trajectories")
        model = self.accelerator.unwrap_model(self.model)
        policy = live_policy(self, model)
        was_training = model.training
        model.eval()
        try:
            return self.source.run(
                policy,
                cases,
                group_size=self.group_size,
                context=self.flow_context,
                step=self.state.global_step,
                rank=self.accelerator.process_index,
            )
        finally:
            model.train(was_training)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        started = time.perf_counter()
        cases = sampled_cases(inputs)  # TRL repeats each prompt G times; we roll out G times
        if isinstance(self.source, Replay):
            trajectories = self.source.run(cases)
        else:
            trajectories = self.rollout(cases)
        batch = build_flow_grpo_rows(
            trajectories,
            self.mode,
            nodes=self.nodes,
            scale=cast(Scale, self.flow_args.scale_rewards),
            drop_zero_variance=self.drop_zero_variance,
            max_completion_length=self.flow_args.max_completion_length,
            step_credit=self.step_credit,
            sampling=self.flow_context.planner_sampling(),  # stored/offline rows checked
        )
        if self.server is not None:  # rows an older adapter sampled: importance-corrected
            self.server.correct(self, batch.rows)
        if not batch.rows:
            warn_no_rows(self.state.global_step, len(trajectories))
        tokenizer: Any = self.processing_class
        output = step_tensors(  # global weights, pieces, padding: `training/layout.py`
            batch.rows,
            self.mode,
            Batching.of(self.args, self.accelerator.num_processes),
            gather=self.accelerator.gather,
            pad_token_id=tokenizer.pad_token_id,
            device=self.accelerator.device,
        )
        if (reference := self._reference_logps(output)) is not None:
            output["ref_per_token_logps"] = reference
        live: Any = self.model
        metrics = self._metrics["train" if live.training else "eval"]
        values, self.group_rewards = flow_metrics(
            trajectories, batch.stats, time.perf_counter() - started
        )
        for key, value in values.items():
            metrics[key].append(value)
        self.rollout_ended = time.perf_counter()
        return output

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        return next_piece(self, generation_batch)  # TRL's, minus its shuffle: the layout's order

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """TRL's loss in chunks of rows (`micro.chunked_loss`); an empty update is skipped."""
        return chunked_loss(self, model, inputs, partial(super().compute_loss, model))

    def _reference_logps(self, tensors: dict[str, Any]) -> Any:
        """Recompute the old logprobs if asked; return the reference's (None at beta 0)."""
        if self.recompute_old_logprobs:  # before any update of this batch, as verl does
            (self.vllm.recompute_old_logps if self.vllm else recompute_old_logps)(self, tensors)
        return reference_logps(self, tensors) if self.beta != 0.0 else None
