"""Run a Flow-GRPO training job from a `TrainConfig`: models, data, trainer, final policy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flowlearn.nodes.hf_policy import HFPolicy
from flowlearn.training.checkpoints import last_complete_checkpoint, save_atomically
from flowlearn.training.config import TrainConfig


class FrozenBasePolicy(HFPolicy):
    """The LoRA model with its adapter switched off: the frozen base, serving as a fixed engine.

    Policies over one model share its lock (`model_lock`), so the adapter is never toggled
    under a running call of the trained policy, batched or not.
    """

    def __init__(self, policy: HFPolicy) -> None:
        super().__init__(policy.model, policy.tokenizer, version=f"{policy.version}:base")

    def generate(self, messages: Any, sampling: Any, *, streamer: Any = None) -> Any:
        """Generate with the adapter disabled."""
        with self._lock, self.model.disable_adapter():
            return super().generate(messages, sampling, streamer=streamer)


def grpo_args(config: TrainConfig, cuda: bool) -> Any:
    """Translate the config into TRL's GRPOConfig (one generation batch per update)."""
    from trl.trainer.grpo_config import GRPOConfig

    return GRPOConfig(
        output_dir=config.output_dir,
        per_device_train_batch_size=config.questions_per_step * config.group_size,
        num_generations=config.group_size,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        max_steps=config.max_steps,
        learning_rate=config.learning_rate,
        beta=config.beta,
        epsilon=config.epsilon,
        epsilon_high=config.epsilon_high,
        loss_type="dapo",
        temperature=config.planner_temperature,
        max_completion_length=config.planner_max_new_tokens,
        logging_steps=config.logging_steps,
        save_strategy="steps",
        save_steps=config.save_steps,
        report_to=config.report_to,
        seed=config.seed,
        bf16=config.bf16 if config.bf16 is not None else cuda,
        gradient_checkpointing=config.gradient_checkpointing,
        use_cpu=not cuda,
    )


def train(config: TrainConfig) -> Path:
    """Train and return the folder of the final policy (loadable by `flowlearn run --planner`)."""
    resume_from = None
    if config.resume:  # checked before any model is loaded
        resume_from = last_complete_checkpoint(config.output_dir)
        if resume_from is None:
            raise ValueError(
                f"resume: no complete checkpoint in {config.output_dir}; "
                "run without --resume to start fresh"
            )
    import torch

    from flowlearn.nodes.hf_chat import HFChatModel
    from flowlearn.nodes.hf_loading import load_model_and_tokenizer
    from flowlearn.nodes.schema.context import Context
    from flowlearn.nodes.tools import default_tools
    from flowlearn.training.collect import format_penalty
    from flowlearn.training.flow_grpo import StepCredit
    from flowlearn.training.store import TrajectoryStore, load_trajectories
    from flowlearn.training.trainer import FlowGRPOTrainer

    cuda = (config.device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda")
    model, tokenizer = load_model_and_tokenizer(config.planner, device=config.device)
    lora = config.lora if config.lora is not None else model.num_parameters() > 1e9
    if lora:  # wrapped here, so the frozen base can serve as the engine; TRL sees a PeftModel
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=config.lora_r,
                lora_alpha=config.lora_alpha,
                target_modules="all-linear",
                task_type="CAUSAL_LM",
            ),
        )
    context = Context(
        max_turns=config.max_turns,
        planner_temperature=config.planner_temperature,
        planner_max_new_tokens=config.planner_max_new_tokens,
        tools=tuple(config.tools) if config.tools else None,
    )
    common: dict[str, Any] = dict(
        args=grpo_args(config, cuda),
        context=context,
        processing_class=tokenizer,
        mode=config.mode,
        scale=config.scale,
        drop_zero_variance=config.drop_zero_variance,
        step_credit=StepCredit(config.step_credit_weight, config.step_credit_gamma)
        if config.step_credit_weight
        else None,
    )
    out = Path(config.output_dir)
    if config.trajectories:
        trainer = FlowGRPOTrainer(
            model, trajectories=load_trajectories(config.trajectories), **common
        )
    else:
        cases, scorer = _cases_and_scorer(config)
        if config.engine == "base":
            backend: HFPolicy = FrozenBasePolicy(HFPolicy(model, tokenizer))
        else:
            backend = HFPolicy.from_pretrained(
                config.engine or config.planner, device=config.device
            )
        engine = HFChatModel(policy=backend, max_new_tokens=config.engine_max_new_tokens)
        trainer = FlowGRPOTrainer(
            model,
            cases=cases,
            engine=engine,
            tools=default_tools(engine, corpus=config.corpus),
            scorer=scorer,
            rollout_store=TrajectoryStore(out / "rollouts.jsonl"),
            reward_errors=config.reward_errors,
            extra_rewards={"format_penalty": format_penalty(config.format_penalty)}
            if config.format_penalty
            else None,
            **common,
        )
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    return save_final(trainer, tokenizer, out / "final", merge=lora)


def _cases_and_scorer(config: TrainConfig) -> tuple[list[Any], Any]:
    from flowlearn.evals.benchmarks import BENCHMARKS, load_benchmark, score_case
    from flowlearn.evals.cases import load_cases

    if config.benchmark:
        cases = load_benchmark(config.benchmark, limit=config.limit)
        name = config.scorer or BENCHMARKS[config.benchmark].scorer
    else:
        cases = load_cases(str(config.data), limit=config.limit)
        name = config.scorer or "exact_match"
    return cases, lambda answer, case: score_case(name, answer, case)


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
