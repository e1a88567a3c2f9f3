"""Run a Flow-GRPO training job: a `FlowGRPOConfig` and its built parts in, the final policy out.

Why it looks like this:
1. Stored rollouts are the cheapest part of a run to lose and the easiest to misuse: a fresh
   run in a folder that holds another run's rollouts would train on them, since rollout ids
   (`step{k}:{case}/{i}`) repeat from run to run. So every run gets an id, written once to
   `run.json` and kept by `--resume`, and every rollout id ends in `@{run_id}`.
2. Only `--resume` reuses stored rollouts, and only when the settings that shape a rollout
   (given the checkpoint's weights) are the ones they were made with: `ROLLOUT_SETTINGS`.
   Settings of the update alone (learning rate, KL, mode, max_steps, ...) may change.
3. A fresh run in a folder with stored rollouts is refused, never cleaned up behind the
   user's back: the rollouts may be the only record of an expensive run.
4. Checkpoints a crash cannot corrupt: transformers writes a checkpoint's files in place and
   `trainer_state.json` last. A process killed while saving leaves a folder without that file,
   or with a torn one; resuming from it would fail or, worse, load half-written weights. So a
   checkpoint counts only when its state file parses; an incomplete one is renamed
   `incomplete-checkpoint-N` (kept for inspection, out of transformers' way) and training
   resumes from the one before. Final models are swapped in whole by
   `flowlearn.files.save_atomically`.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.tools import BaseTool

from flowlearn.engine.saved_adapters import write_adapters_record
from flowlearn.engine.tokens import ModelHandle
from flowlearn.errors import UsageError
from flowlearn.evals.cases import Case
from flowlearn.evals.scorers import CaseScorer
from flowlearn.files import save_atomically, write_text_atomically
from flowlearn.nodes.prompts import (
    AGENTFLOW_PROMPTS,
    PROMPTS_RECORD,
    Prompts,
    write_prompts_record,
)
from flowlearn.outputs import MARKER, claim_folder, read_marker
from flowlearn.training.config import FlowGRPOConfig
from flowlearn.training.model import check_finite_weights, init_kwargs_kept_from_trl
from flowlearn.training.rollouts import Rollouts, format_penalty, new_run_id
from flowlearn.training.rows import StepCredit
from flowlearn.training.schedule import check_resumed_step
from flowlearn.training.trainer import FlowGRPOTrainer
from flowlearn.training.trajectories import TrajectoryStore, load_trajectories
from flowlearn.training.vllm.lora_server import ServerGeneration

logger = logging.getLogger(__name__)

RUN_FILE = "run.json"
ROLLOUTS_FILE = "rollouts.jsonl"
"""Rank 0's rollout store; rank N writes `rollouts.rankN.jsonl` beside it."""

ROLLOUT_SETTINGS = (
    "planner",
    "engine",
    "engine_max_new_tokens",
    "benchmark",
    "data",
    "scorer",
    "limit",
    "corpus",
    "tools",
    "prompts",
    "query_analysis",
    "max_turns",
    "temperature",
    "top_p",
    "max_completion_length",
    "num_generations",
    "questions_per_step",
    "seed",
    "data_seed",
    "shuffle_dataset",
    "format_penalty",
    "train_nodes",
    "node_settings",
)
"""Config fields a stored rollout depends on: the models and tools of the flow, the questions
(which ones each step takes), the planner's sampling, G, and the reward it was given."""

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


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
    engine_name: str | None = None
    """The local fixed engine the rollouts used, recorded in `final/` (None: served)."""
    base_name: str | None = None
    """The planner model as named (the base of every node's adapter), recorded in `final/`."""


def train(config: FlowGRPOConfig, parts: TrainingParts, *, resume_from: Path | None = None) -> Path:
    """Train and return the folder of the final policy (loadable by `flowlearn run --planner`).

    Online, the run gets its id (`open_run`): a new one, or with `resume` (or a
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
    claim_output_dir(config, resuming=config.resume or resume_from is not None)
    # model_init_kwargs were applied when the planner loaded (`load_planner`)
    with init_kwargs_kept_from_trl(config):
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
                rollout_concurrency=config.rollout_concurrency,
                handle=parts.handle,
                server=served(config, out),
                extra_rewards={
                    "format_penalty": format_penalty(config.format_penalty, config.train_nodes)
                }
                if config.format_penalty
                else None,
                **common,
            )
            start_run(trainer, config, resuming=config.resume or resume_from is not None)
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    final = out / "final"
    return save_final(
        trainer,
        parts.tokenizer,
        final,
        merge=parts.lora,
        prompts=parts.prompts,
        engine=parts.engine_name,
        base=parts.base_name,
    )


def served(config: FlowGRPOConfig, out: Path) -> ServerGeneration | None:
    """Return the rollouts' vLLM server (`planner_url`), adapters under `adapter_dir`, or None.

    With several trained nodes, the nodes not trained name the served base: the engine's name
    when `engine_url` is the same server, else the server's own answer.
    """
    return ServerGeneration.of(config, out)


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
        given = Path(config.resume_from_checkpoint)
        check_resumed_step(given, config.max_steps)  # before any model loads
        return given
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
    check_resumed_step(found, config.max_steps)  # before any model loads
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


def save_final(
    trainer: Any,
    tokenizer: Any,
    folder: Path,
    *,
    merge: bool,
    prompts: Prompts | None = None,
    engine: str | None = None,
    base: str | None = None,
) -> Path:
    """Save the trained policy as a plain model folder (LoRA merged into its base), atomically.

    With `prompts`, the folder names the prompt set it was trained under and `engine` the local
    fixed engine, so `flowlearn run` and `eval` serve it with the same
    (`nodes.prompts.PROMPTS_RECORD`). Several trained nodes are saved unmerged instead: one
    adapter per node in `<node>/`, the tokenizer, and `base` (the model they adapt) named in
    `engine.saved_adapters.ADAPTERS_RECORD`. Under `accelerate launch` only the main process writes;
    the others wait for it. A model with a NaN or infinite weight is refused
    (`TrainingDivergedError`) and nothing is written.
    """
    accelerator = trainer.accelerator
    accelerator.wait_for_everyone()
    check_finite_weights(accelerator.unwrap_model(trainer.model))  # every process: none waits
    roles = getattr(trainer, "roles", None)
    if roles is not None:
        merge = False  # one adapter per node, on one base: nothing to merge into
    adapter = folder.parent / "final-adapter"
    for saved in (folder, adapter) if merge else (folder,):
        refuse_foreign_model(saved)  # every process: none waits for a saver that refused
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(trainer.model)
        marker = read_marker(folder.parent / MARKER) or {"command": "train"}
        if merge:

            def save_adapter(staging: Path) -> None:
                model.save_pretrained(staging)
                write_text_atomically(staging / MARKER, json.dumps(marker) + "\n")

            save_atomically(adapter, save_adapter)
            model = model.merge_and_unload()

        def save(staging: Path) -> None:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            if roles is not None:
                write_adapters_record(
                    staging,
                    base or str(next(iter(model.peft_config.values())).base_model_name_or_path),
                    roles.nodes,
                )
            if prompts is not None:
                write_prompts_record(staging, prompts, engine=engine)
            write_text_atomically(staging / MARKER, json.dumps(marker) + "\n")

        save_atomically(folder, save)
    accelerator.wait_for_everyone()
    return folder


def claim_output_dir(config: Any, *, resuming: bool, create: bool = True) -> None:
    """Make `output_dir` this training run's, or refuse it (`flowlearn.outputs.claim_folder`).

    A folder another command made, or one holding files flowlearn did not write, is refused;
    so is a fresh run (no `resume`) where an earlier run left checkpoints or a final policy,
    which it would mix its own into or replace. A folder of an older flowlearn's run (its
    `run.json`, no marker) is adopted. With `create=False` it only checks (the CLI, before any
    model loads) and writes nothing.

    Raises:
        UsageError: naming the folder and the fix (`--resume`, or a new output_dir).

    """
    out = Path(str(config.output_dir))
    claim_folder(out, "train", flag="output_dir", adopt=(RUN_FILE,), create=create)
    if resuming or not out.is_dir():
        return
    earlier = sorted(
        p.name
        for p in out.iterdir()
        if _CHECKPOINT.match(p.name) or p.name in {"final", "final-adapter"}
    )
    if earlier:
        raise UsageError(
            f"output_dir {out} holds {', '.join(earlier)} of an earlier run; pass --resume to "
            "continue it, or give a new output_dir (nothing is deleted for you)"
        )


def refuse_foreign_model(folder: Path) -> None:
    """Refuse to replace a model folder a training run did not save (no marker, no prompts record).

    Raises:
        UsageError: naming the folder; nothing is replaced.

    """
    if not folder.exists():
        return
    marked = (folder / MARKER).exists() or (folder / PROMPTS_RECORD).exists()
    if not marked:
        raise UsageError(
            f"{folder} was not saved by flowlearn train (no {MARKER}); move it aside, or give "
            "a new output_dir (it is never replaced for you)"
        )


def rollout_settings(config: Any) -> dict[str, Any]:
    """Return the config's `ROLLOUT_SETTINGS` as JSON values."""
    values = {name: getattr(config, name, None) for name in ROLLOUT_SETTINGS}
    loaded: dict[str, Any] = json.loads(json.dumps(values, default=str))
    return loaded


def stored_rollouts(out: Path) -> list[Path]:
    """Return the rollout stores in `out` that hold anything, every rank's."""
    stem = Path(ROLLOUTS_FILE).stem
    return sorted(p for p in out.glob(f"{stem}*.jsonl") if p.is_file() and p.stat().st_size)


def read_run(out: Path) -> dict[str, Any] | None:
    """Return the run record of `out`, or None when there is none.

    Raises:
        ValueError: a record that is not one (named), rather than a silent new run id.

    """
    path = out / RUN_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path} is not a run record ({exc}); move it aside") from None
    if not isinstance(record, dict) or not isinstance(record.get("run_id"), str):
        raise ValueError(f"{path} is not a run record (no run_id); move it aside")
    return record


def check_run(config: Any, *, resuming: bool) -> str | None:
    """Return the id a resumed run keeps (None: a new run); refuse rollouts it must not use.

    Args:
        config: the run's `FlowGRPOConfig`.
        resuming: whether the run continues the one in `output_dir` (`--resume`).

    Raises:
        ValueError: a fresh run in an `output_dir` with stored rollouts, or a resumed run
            whose rollout settings differ from those the stored rollouts were made with.

    """
    if getattr(config, "trajectories", None):
        return None  # offline: nothing rolled out, nothing stored
    out = Path(str(config.output_dir))
    stored = stored_rollouts(out)
    record = read_run(out)
    if not resuming:
        if stored:
            owner = f"run {record['run_id']}" if record else "an earlier run"
            raise ValueError(
                f"{out} already holds the stored rollouts of {owner} "
                f"({', '.join(p.name for p in stored)}); pass --resume to continue that run, "
                "or choose another output_dir (nothing is deleted for you)"
            )
        return None
    if record is None:
        if stored:  # an older flowlearn's run: its ids carry no run id, so none is reused
            logger.warning("%s has no %s: its stored rollouts are not reused", out, RUN_FILE)
        return None
    before, now = dict(record.get("rollout_settings", {})), rollout_settings(config)
    before.setdefault("prompts", None)  # recorded before it was a setting: the default
    before.setdefault("query_analysis", True)  # recorded before it was a setting: always on
    changed = [name for name in ROLLOUT_SETTINGS if name in before and before[name] != now[name]]
    if changed and stored:
        diff = "; ".join(f"{name} {before[name]!r}, now {now[name]!r}" for name in changed)
        raise ValueError(
            f"--resume: the stored rollouts of run {record['run_id']} in {out} were made with "
            f"other settings ({diff}); resume with the same ones, or choose another output_dir"
        )
    run_id: str = record["run_id"]
    return run_id


def open_run(config: Any, *, resuming: bool) -> str:
    """Check as `check_run`, write the run record, and return this run's id.

    A resumed run keeps its id; a fresh one takes its folder's (the marker's `run_id`), so
    `run.json`, the rollout ids and `flowlearn-run.json` name the run alike; a folder whose
    marker names another id (an older flowlearn's) has its marker brought to the run's.
    Call it on the main process only.
    """
    out = Path(str(config.output_dir))
    marker = read_marker(out / MARKER)
    run_id = check_run(config, resuming=resuming) or (marker or {}).get("run_id") or new_run_id()
    record = {"run_id": run_id, "rollout_settings": rollout_settings(config)}
    write_text_atomically(out / RUN_FILE, json.dumps(record, indent=1) + "\n")
    if marker is not None and marker["run_id"] != run_id:
        marked = {**marker, "run_id": run_id}
        write_text_atomically(out / MARKER, json.dumps(marked, indent=1) + "\n")
    return str(run_id)


def is_complete(folder: Path) -> bool:
    """Whether `folder` is a checkpoint whose trainer state (written last) is whole."""
    try:
        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(state, dict) and isinstance(state.get("global_step"), int)


def last_complete_checkpoint(output_dir: str | Path) -> Path | None:
    """Return the newest complete `checkpoint-N` in `output_dir`, setting incomplete ones aside."""
    root = Path(output_dir)
    found = sorted(
        (int(m.group(1)), path)
        for path in (root.iterdir() if root.is_dir() else [])
        if path.is_dir() and (m := _CHECKPOINT.match(path.name))
    )
    for _, path in reversed(found):
        if is_complete(path):
            return path
        aside = _free_name(root / f"incomplete-{path.name}")
        try:
            path.rename(aside)
        except FileNotFoundError:  # another process of the same job set it aside first
            continue
        logger.warning("%s was cut short by a crash; set aside as %s", path, aside.name)
    return None


def _free_name(path: Path) -> Path:
    candidate, n = path, 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.{n}")
    return candidate
