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
4. TRL's shape, `FlowGRPOTrainer(model, reward_funcs, args, train_dataset)`, builds the
   rollout source from a model name, reward functions and a dataset (`from_trl`); `online`
   (cases, a scorer and a graph) and `offline` (exported trajectories) build it from those.
5. The run's health is written beside the checkpoints (`metrics`): `metrics.jsonl` (TRL's and
   the flow's `flow/*` metrics, each group's mean reward) and the reward curve.
6. A saved model names its prompt set and fixed engine (`flowlearn_prompts.json`), so
   `flowlearn run --planner FOLDER` serves it as it was trained.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool
from trl.trainer.grpo_config import GRPOConfig
from trl.trainer.grpo_trainer import GRPOTrainer

from flowlearn.engine.protocol import NodeBinding, Policy
from flowlearn.engine.saved_adapters import write_adapters_record
from flowlearn.engine.tokens import ModelHandle
from flowlearn.errors import TrainingDivergedError
from flowlearn.evals.cases import Case
from flowlearn.files import write_text_atomically
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts, write_prompts_record
from flowlearn.nodes.schema.context import Context
from flowlearn.training.batches import Batching, step_tensors
from flowlearn.training.config import check_settings, context_from, flow_defaults
from flowlearn.training.from_trl import resolve_source
from flowlearn.training.loop import chunked_loss, next_piece
from flowlearn.training.metrics import (
    FlowMetricsCallback,
    console_log_callbacks,
    flow_metrics,
    model_card,
    read_metrics,
)
from flowlearn.training.model import (
    check_checkpoint,
    frozen_reference,
    init_kwargs_kept_from_trl,
    install_reference,
    recompute_old_logps,
    reference_kept_from_trl,
    reference_logps,
    upcast_trainable,
    warn_on_dropout,
)
from flowlearn.training.producer import AsyncRollouts
from flowlearn.training.rewards import RewardFunc
from flowlearn.training.roles import (
    TrainedRoles,
    load_node_checkpoint,
    local_policy,
    node_learning_rates,
    role_rows,
    sampled_by_role,
)
from flowlearn.training.rollouts import (
    Outcome,
    Replay,
    RewardTerm,
    Rollouts,
    agentflow_factory,
    cases_dataset,
    sampled_cases,
    unused_reward,
)
from flowlearn.training.rows import Mode, Scale, StepCredit, build_flow_grpo_rows, check_mode
from flowlearn.training.schedule import check_resumed_step, rebuild_schedule, warn_if_not_learning
from flowlearn.training.trajectories import Trajectory, TrajectoryStore
from flowlearn.training.vllm.lora_server import ServerGeneration
from flowlearn.training.vllm.trl_engine import (
    VLLMFactory,
    VLLMRollouts,
    attach_vllm,
    vllm_kept_from_trl,
)

__all__ = ["FlowGRPOTrainer", "cases_dataset", "read_metrics", "unused_reward"]

logger = logging.getLogger(__name__)


def embedding_rows(model: Any) -> int:
    """Return the rows of `model`'s input embedding: the ids it can read.

    The tokenizer's length may be smaller: Qwen2.5 pads its vocabulary, and a model may sample
    a padded id.
    """
    return int(getattr(model, "module", model).get_input_embeddings().num_embeddings)


def check_questions(context: Context, questions: Sequence[Any]) -> None:
    """Refuse a question `context` would refuse (`Context.check_question`), naming its id."""
    for case in questions:
        try:
            context.check_question(case.query)
        except ValueError as exc:
            raise ValueError(f"question {case.id!r}: {exc}") from None


class FlowGRPOTrainer(GRPOTrainer):
    """Train the planner with Flow-GRPO, online through the flow or offline from trajectories.

    In TRL's shape, `FlowGRPOTrainer(model="Qwen/...", reward_funcs=[...],
    args=FlowGRPOConfig(...), train_dataset=dataset)` trains the planner of the default
    AgentFlow graph on the dataset's questions, G rollouts each, rewarded by the reward
    functions on each rollout's final answer; the engine, tools and prompt set come from
    `args` as `flowlearn train` makes them (`flowlearn.training.from_trl`) unless given.
    """

    def __init__(
        self,
        model: Any,
        reward_funcs: RewardFunc | str | Sequence[RewardFunc | str] | None = None,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        *,
        source: Rollouts | Replay | None = None,
        engine: BaseChatModel | None = None,
        tools: Sequence[BaseTool] | None = None,
        prompts: Prompts | None = None,
        graph_factory: Callable[[Policy], Any] | None = None,
        context: Context | None = None,
        nodes: Sequence[str] | None = None,
        mode: Mode | None = None,
        drop_zero_variance: bool | None = None,
        step_credit: StepCredit | None = None,
        recompute_old_logprobs: bool | None = None,
        vllm: VLLMFactory | None = None,
        **kwargs: Any,
    ) -> None:
        """Set up training, in TRL's shape or from a `source` (`online`, `offline`).

        Args:
            model: the policy to train: a transformers model, a PeftModel for LoRA, or (in
                TRL's shape) a hub id, folder, .gguf file or `default`/`default-base`.
            reward_funcs: TRL's reward functions `(completions, **kwargs) -> list[float]` or
                scorer names, scoring each rollout's answer (`rewards`); TRL's shape only.
            args: a `FlowGRPOConfig` (with a `source`, any `GRPOConfig`): `num_generations`
                is G, `temperature` the planner's. Default: `FlowGRPOConfig()`.
            train_dataset: TRL's shape: the questions, a `datasets.Dataset` or rows with a
                question (`question`, `query`, `prompt`) and an answer column.
            source: where each step's trajectories come from (`Rollouts` or `Replay`),
                instead of `reward_funcs` and `train_dataset`.
            engine: TRL's shape: the fixed chat model; default from `args` (`from_trl`).
            tools: TRL's shape: the tools; default: the default tools over the engine.
            prompts: TRL's shape: the prompt set; default from `args` and the model.
            graph_factory: TRL's shape: any graph, from the live policy (see `online`).
            context: the run context; default `args.context()` (`flow_defaults`).
            nodes: which nodes' transitions become rows; None: every call of the trained policy.
            mode: the Flow-GRPO weighting mode; default `args.mode`, else "paper".
            drop_zero_variance: drop groups whose rewards are all equal; default from args.
            step_credit: optional GiGPO-style step credit; default from args.
            recompute_old_logprobs: old logprobs from a no-grad training forward (verl's
                way) instead of the logged ones; None: `args.recompute_old_logprobs`.
            vllm: under `args.use_vllm`, builds the engine (`vllm.trl_engine`); None: TRL's own.
            **kwargs: passed to `GRPOTrainer` (e.g. `processing_class`, `callbacks`).

        Raises:
            ValueError: settings that disagree, both shapes at once, fewer questions than
                one step takes, or a question over the context's `max_question_chars`.

        """
        model, args, source, self.flow_parts = resolve_source(
            model, reward_funcs, args, train_dataset, source, kwargs, engine=engine,
            tools=tools, prompts=prompts, graph_factory=graph_factory,
        )  # fmt: skip
        context, mode, drop_zero_variance, step_credit, recompute = flow_defaults(
            args, context, mode, drop_zero_variance, step_credit, recompute_old_logprobs
        )
        self.flow_context = context or context_from(args)
        questions = source.questions()
        check_settings(args, self.flow_context, len(questions), offline=isinstance(source, Replay))
        if isinstance(source, Rollouts):  # before any rollout
            check_questions(self.flow_context, questions)
        self.source = source
        self.roles = TrainedRoles.of(args, model, nodes)  # several nodes: an adapter each
        self.nodes = list(self.roles.nodes) if self.roles else nodes
        self.model_handle: ModelHandle | None = getattr(self.flow_parts, "handle", None)
        """The handle every policy over the trained model shares (TRL's shape, `online`)."""
        self.server: ServerGeneration | None = getattr(self.flow_parts, "server", None)
        """The vLLM server rollouts sample on, adapters pushed (`online`, or your graph's)."""
        check_mode(mode)
        self.mode, self.drop_zero_variance, self.step_credit = mode, drop_zero_variance, step_credit
        self.recompute_old_logprobs = recompute
        reference = frozen_reference(model, args.beta)  # before TRL patches it; as loaded
        upcast_trainable(model)  # fp32 master weights; bf16=True autocasts the compute
        warn_on_dropout(model, args.disable_dropout)
        keep = reference_kept_from_trl(args, reference, node_adapters=self.roles is not None)
        loaded = init_kwargs_kept_from_trl(args) if self.flow_parts else contextlib.nullcontext()
        with keep, vllm_kept_from_trl(args), loaded:  # ours instead; TRL's shape loaded the model
            super().__init__(
                model=model,
                # never called (rewards come from the source); TRL checks reward_weights on them
                reward_funcs=list(self.flow_parts.outcome.funcs)
                if self.flow_parts is not None
                else [unused_reward],
                args=args,
                train_dataset=cases_dataset(questions),
                **kwargs,
            )
        install_reference(self, reference)
        self.vllm: VLLMRollouts | None = attach_vllm(self, vllm)  # under use_vllm
        self.group_size = int(args.num_generations or 1)
        self.flow_args: GRPOConfig = args
        self.rollout_ended: float | None = None
        self.group_rewards: dict[str, float] = {}  # per question, this step's
        self.rollouts_ahead = AsyncRollouts.attach(self)  # under max_staleness > 0, else None
        self.add_callback(FlowMetricsCallback(self))
        console_log_callbacks(self, verbose=getattr(args, "verbose", False))  # a line a step

    @classmethod
    def online(
        cls,
        model: Any,
        *,
        args: GRPOConfig,
        cases: Sequence[Case],
        scorer: Outcome,
        engine: BaseChatModel | None = None,
        tools: Sequence[BaseTool] = (),
        prompts: Prompts = AGENTFLOW_PROMPTS,
        graph_factory: Callable[[Policy], Any] | None = None,
        extra_rewards: Mapping[str, RewardTerm] | None = None,
        rollout_store: TrajectoryStore | None = None,
        rollout_concurrency: int | None = None,
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
                None (default): every rollout of the step, questions x G, as TRL generates.
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
                progress=self.is_world_process_zero() and not self.args.disable_tqdm,
            )
        finally:
            model.train(was_training)

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        started = time.perf_counter()
        warn_if_not_learning(self.optimizer, self.state.global_step + 1)  # rollouts cost
        cases = sampled_cases(inputs)  # TRL repeats each prompt G times; we roll out G times
        live: Any = self.model
        if isinstance(self.source, Replay):
            trajectories = self.source.run(cases)
        elif self.rollouts_ahead is not None and live.training:  # made while we trained
            trajectories = self.rollouts_ahead.take(cases)
        else:
            trajectories = self.rollout(cases)
        options: dict[str, Any] = dict(
            scale=cast(Scale, self.flow_args.scale_rewards),
            drop_zero_variance=self.drop_zero_variance,
            max_completion_length=self.flow_args.max_completion_length,
            step_credit=self.step_credit,
            sampling=self.flow_context.planner_sampling(),  # stored/offline rows checked
            mask_truncated=self.flow_args.mask_truncated_completions,  # DAPO's overlong filter
            end_ids={*self.eos_token_ids, self._tokenizer.pad_token_id},  # TRL's eos_and_pad
            vocab_size=embedding_rows(self.model),  # an id past it is refused, not an IndexError
        )
        node_stats: dict[str, dict[str, Any]] = {}
        if self.roles is not None:  # each node's rows, advantages and weights (`roles`)
            batch, node_stats = role_rows(trajectories, self.roles, self.mode, **options)
        else:
            batch = build_flow_grpo_rows(trajectories, self.mode, nodes=self.nodes, **options)
        if self.rollouts_ahead is not None:  # rows of older weights: importance-corrected
            self.rollouts_ahead.correct(batch.rows)
        elif self.server is not None:  # rows an older adapter sampled: importance-corrected
            self.server.correct(self, batch.rows)
        if not batch.rows:
            warn_no_rows(self.state.global_step, len(trajectories))
        tokenizer: Any = self.processing_class
        output = step_tensors(  # global weights, pieces, padding: `batches.step_tensors`
            batch.rows,
            self.mode,
            Batching.of(self.args, self.accelerator.num_processes),
            gather=self.accelerator.gather,
            pad_token_id=tokenizer.pad_token_id,
            device=self.accelerator.device,
            nodes=self.roles.nodes if self.roles else (),
        )
        if (reference := self._reference_logps(output)) is not None:
            output["ref_per_token_logps"] = reference
        metrics = self._metrics["train" if live.training else "eval"]
        values, self.group_rewards = flow_metrics(
            trajectories, batch.stats, time.perf_counter() - started, node_stats
        )
        for key, value in values.items():
            metrics[key].append(value)
        self.rollout_ended = time.perf_counter()
        return output

    def get_batch_samples(
        self, epoch_iterator: Any, num_batches: int, device: Any
    ) -> tuple[list[Any], Any]:
        """TRL's; under `max_staleness` the next steps' questions go to the producer early."""
        if self.rollouts_ahead is None:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        reading = self.rollouts_ahead.reading(epoch_iterator)
        samples, items = super().get_batch_samples(reading, num_batches, device)
        self.rollouts_ahead.hand_over(samples, num_batches)
        return samples, items

    def train(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's `train`; asynchronous rollouts stop with it, in flight ones dropped."""
        try:
            return super().train(*args, **kwargs)
        finally:
            if self.rollouts_ahead is not None:
                self.rollouts_ahead.stop()

    def _prepare_inputs(self, generation_batch: Any) -> dict[str, Any]:
        return next_piece(self, generation_batch)  # TRL's, minus its shuffle: the layout's order

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """TRL's loss in chunks of rows (`loop.chunked_loss`); an empty update is skipped."""
        return chunked_loss(self, model, inputs, partial(super().compute_loss, model))

    def training_step(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """TRL's step; stop at a non-finite loss, before the optimizer applies its gradients.

        TRL (`logging_nan_inf_filter`) would log a stand-in loss and step on NaN gradients.
        Under several processes the gradient norm, the same on every rank, decides instead, so
        no rank stops alone while the others wait for it.
        """
        loss = super().training_step(model, inputs, *args, **kwargs)
        if self.accelerator.num_processes == 1:
            stop_if_not_finite("loss", loss, self.state.global_step)
        return loss

    def create_model_card(self, *args: Any, **kwargs: Any) -> None:
        """Write the run's model card (`metrics.model_card`) in place of TRL's GRPO card."""
        if not self.is_world_process_zero():
            return
        config = cast(Any, self.model).config
        name = kwargs.get("model_name") or Path(str(self.args.output_dir)).name
        card = model_card(str(config.name_or_path) or None, name, self.state.global_step)
        path = Path(str(self.args.output_dir)) / "README.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, card)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as TRL does, and (TRL's shape, the AgentFlow graph) name its prompts and engine."""
        super().save_model(output_dir, _internal_call=_internal_call)
        folder = Path(str(output_dir or self.args.output_dir))
        if self.roles is not None and self.is_world_process_zero() and folder.is_dir():
            live = self.accelerator.unwrap_model(self.model)  # what `run --planner` loads
            named = getattr(self.flow_parts, "base_name", None)
            base = named or next(iter(live.peft_config.values())).base_model_name_or_path
            write_adapters_record(folder, str(base), self.roles.nodes)
        parts = self.flow_parts
        if parts is None or parts.prompts is None:  # a ready source, or the caller's own graph
            return
        if self.is_world_process_zero() and folder.is_dir():
            write_prompts_record(folder, parts.prompts, engine=parts.engine_name)

    def _get_grad_norm(self, model: Any, grad_norm: Any = None) -> Any:
        # Called at every optimizer step, after clipping and before the step: the last moment a
        # NaN or infinite gradient can still be kept out of the weights.
        norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        stop_if_not_finite("gradient norm", norm, self.state.global_step)
        return norm

    def create_optimizer(self, model: Any = None) -> Any:
        """TRL's optimizer; with node learning rates, each node's adapter in its own groups."""
        optimizer = super().create_optimizer(*(() if model is None else (model,)))
        rates = self.roles.learning_rates() if self.roles else {}
        if rates:
            live = self.accelerator.unwrap_model(self.model)
            self.optimizer = optimizer = node_learning_rates(optimizer, live, rates)
        return optimizer

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Load TRL's optimizer and schedule, the step checked, the schedule rebuilt (`schedule`).

        Raises:
            ValueError: a checkpoint whose `global_step` cannot be its own (`check_resumed_step`).

        """
        if checkpoint is not None:
            check_resumed_step(Path(checkpoint), self.args.max_steps)
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None:
            rebuild_schedule(self.lr_scheduler)  # for this run's max_steps, not the old one's

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """Load a checkpoint's weights; with node adapters, each node's from `<node>/`.

        Called before the optimizer, scheduler and RNG states load, so the checkpoint is
        checked here first (`check_checkpoint`): no pickled objects, the model's shapes.
        """
        live = self.accelerator.unwrap_model(model or self.model)
        check_checkpoint(Path(resume_from_checkpoint), live)
        if self.roles is None:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            return
        load_node_checkpoint(live, Path(resume_from_checkpoint), self.roles.nodes)

    def _reference_logps(self, tensors: dict[str, Any]) -> Any:
        """Recompute the old logprobs if asked; return the reference's (None at beta 0)."""
        if self.recompute_old_logprobs:  # before any update of this batch, as verl does
            (self.vllm.recompute_old_logps if self.vllm else recompute_old_logps)(self, tensors)
        return reference_logps(self, tensors) if self.beta != 0.0 else None


def live_policy(trainer: Any, model: Any) -> Policy | NodeBinding:
    """Return the step's planner: the live model, versioned `output_dir@step`.

    It samples locally on the trainer's handle (shared with the frozen base), on a vLLM server
    under this step's LoRA adapter (`trainer.server`), or on TRL's vLLM engine
    (`trainer.vllm`). With several trained nodes it is a `NodePolicies`: each node under its
    own adapter (locally, or on the server under its own name), the others on the base.
    """
    if trainer.model_handle is None or trainer.model_handle.model is not model:
        trainer.model_handle = ModelHandle(model, trainer.processing_class)
    version = f"{trainer.args.output_dir}@{trainer.state.global_step}"
    roles: TrainedRoles | None = trainer.roles
    if trainer.server is not None:  # on the server, under this step's adapter (each node's)
        served = trainer.server.live_policy(trainer, model)  # several nodes: `NodePolicies`
        return sampled_by_role(served, roles)  # type: ignore[no-any-return]
    if trainer.vllm is not None:  # TRL's vLLM engine, weights synced each step
        return trainer.vllm.policy(trainer, version)  # type: ignore[no-any-return]
    return local_policy(trainer.model_handle, version, roles)  # type: ignore[no-any-return]


def stop_if_not_finite(name: str, value: Any, step: int) -> None:
    """Stop training at a NaN or infinite loss or gradient norm, before the weights take it.

    Raises:
        TrainingDivergedError: naming the value and the step.

    """
    if value is None:
        return
    number = float(value.detach().float().item() if hasattr(value, "detach") else value)
    if not math.isfinite(number):
        raise TrainingDivergedError(
            f"training stopped at step {step + 1}: the {name} is {number} (not finite); the "
            "weights were not updated with it and no final policy is saved. Check the data's "
            "rewards and logprobs, lower the learning rate, or resume from an earlier checkpoint"
        )


def warn_no_rows(step: int, rollouts: int) -> None:
    """Say that this process has no rows this step (the update is skipped if no process has)."""
    logger.warning(
        "step %d: this process has no rows to train on (%d rollouts, all dropped or "
        "without policy turns); an update no process has rows for is skipped",
        step,
        rollouts,
    )
