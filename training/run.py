"""Run a Flow-GRPO training job: a `FlowGRPOConfig` and its built parts in, the final policy out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import CaseScorer
from flowlearn.evals.tasks import load_cases_and_scorer
from flowlearn.nodes.files import save_atomically
from flowlearn.nodes.policies.handle import ModelHandle
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts
from flowlearn.training.checkpoints import last_complete_checkpoint
from flowlearn.training.collect import format_penalty
from flowlearn.training.config import FlowGRPOConfig
from flowlearn.training.flow_grpo import StepCredit
from flowlearn.training.rollouts import Rollouts
from flowlearn.training.run_record import ROLLOUTS_FILE, open_run, read_run
from flowlearn.training.server_generation import ServerGeneration
from flowlearn.training.store import TrajectoryStore, load_trajectories
from flowlearn.training.trainer import FlowGRPOTrainer


@dataclass
class TrainingParts:
    """What a training job runs on, built from the config's names by the composition root.

    `flowlearn.training_parts` builds it: the planner (LoRA-wrapped or not) and, online, the
    fixed engine, the tools, the cases and their scorer.
    """

    model: Any
    tokenizer: Any
    lora: bool
    engine: BaseChatModel | None = None
    tools: list[BaseTool] = field(default_factory=list)
    cases: list[Case] | None = None
    scorer: CaseScorer | None = None
    handle: ModelHandle | None = None
    prompts: Prompts = AGENTFLOW_PROMPTS
    """The planner's handle, shared with the frozen base when it is the engine."""


def train(config: FlowGRPOConfig, parts: TrainingParts, *, resume_from: Path | None = None) -> Path:
    """Train and return the folder of the final policy (loadable by `flowlearn run --planner`).

    Online, the run gets its id (`training.run_record`): a new one, or with `resume` (or a
    checkpoint to resume from) the stored one, whose rollouts are then reused.

    Raises:
        ValueError: a fresh run in an `output_dir` holding stored rollouts, or a resumed run
            with other rollout settings than its stored rollouts.

    """
    common: dict[str, Any] = dict(
        args=config,
        context=config.context(),
        processing_class=parts.tokenizer,
        mode=config.mode,
        drop_zero_variance=config.drop_zero_variance,
        step_credit=StepCredit(config.step_credit_weight, config.step_credit_gamma)
        if config.step_credit_weight
        else None,
    )
    out = Path(str(config.output_dir))
    if parts.cases is None or parts.scorer is None:
        trajectories = load_trajectories(str(config.trajectories))
        trainer = FlowGRPOTrainer.offline(parts.model, trajectories=trajectories, **common)
    else:
        trainer = FlowGRPOTrainer.online(
            parts.model,
            cases=parts.cases,
            scorer=parts.scorer,
            engine=parts.engine,
            tools=parts.tools,
            prompts=parts.prompts,
            rollout_store=TrajectoryStore(out / ROLLOUTS_FILE),
            reward_errors=config.reward_errors,
            handle=parts.handle,
            server=ServerGeneration.at(config.planner_url, config.adapter_dir or out / "adapters")
            if config.planner_url
            else None,
            extra_rewards={"format_penalty": format_penalty(config.format_penalty)}
            if config.format_penalty
            else None,
            **common,
        )
        start_run(trainer, config, resuming=config.resume or resume_from is not None)
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    return save_final(trainer, parts.tokenizer, out / "final", merge=parts.lora)


def resume_point(config: FlowGRPOConfig) -> Path | None:
    """Return the checkpoint to resume from, or None to start fresh.

    That is `resume_from_checkpoint` (TRL's option) if given, or with `resume` the last
    complete checkpoint in `output_dir`: an error when there is none, unless a run started
    there and stopped before its first checkpoint (None: it resumes from its start, keeping
    its run id and stored rollouts).
    """
    if config.resume and config.resume_from_checkpoint:
        raise ValueError("give resume or resume_from_checkpoint, not both")
    if config.resume_from_checkpoint:
        return Path(config.resume_from_checkpoint)
    if not config.resume:
        return None
    found = last_complete_checkpoint(str(config.output_dir))
    if found is None and read_run(Path(str(config.output_dir))) is not None:
        return None
    if found is None:
        raise ValueError(
            f"resume: no complete checkpoint in {config.output_dir}; "
            "run without --resume to start fresh"
        )
    return found


def start_run(trainer: Any, config: FlowGRPOConfig, *, resuming: bool) -> str:
    """Open the run record on the main process; give every process the run id (or its error).

    One process decides, so ranks never disagree on the id; the others wait in the broadcast.
    """
    from accelerate.utils import broadcast_object_list

    box: list[str | None] = [None, None]
    if trainer.accelerator.is_main_process:
        try:
            box[0] = open_run(config, resuming=resuming)
        except ValueError as exc:
            box[1] = str(exc)
    broadcast_object_list(box)
    if box[1] is not None:
        raise ValueError(box[1])
    run_id = str(box[0])
    if isinstance(trainer.source, Rollouts):
        trainer.source.run_id = run_id
    return run_id


def cases_and_scorer(
    config: FlowGRPOConfig, data_dir: str | None = None
) -> tuple[list[Case], CaseScorer]:
    """Return the config's cases and scorer (a data file with no scorer gets exact match)."""
    return load_cases_and_scorer(
        benchmark=config.benchmark,
        data=config.data,
        scorer=config.scorer or (None if config.benchmark else "exact_match"),
        limit=config.limit,
        data_dir=data_dir,
    )


def save_final(trainer: Any, tokenizer: Any, folder: Path, *, merge: bool) -> Path:
    """Save the trained policy as a plain model folder (LoRA merged into its base), atomically.

    Under `accelerate launch` only the main process writes; the others wait for it.
    """
    accelerator = trainer.accelerator
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        if merge:
            save_atomically(folder.parent / "final-adapter", model.save_pretrained)
            model = model.merge_and_unload()

        def save(staging: Path) -> None:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)

        save_atomically(folder, save)
    accelerator.wait_for_everyone()
    return folder
