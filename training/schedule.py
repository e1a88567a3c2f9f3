"""The learning rate across a resume: the checkpoint's step checked, the schedule rebuilt, 0 told.

Why it looks like this:
1. A checkpoint's `trainer_state.json` says which step it resumes at, and transformers trusts
   it: a `global_step` edited to 10**18 skipped every step, and the run exited 0 and wrote
   `final/` from untrained weights. So the step must be the one in the folder's name
   (`checkpoint-N`) and within `max_steps`, or the resume is refused, naming file and field.
2. `--resume --max_steps N` extends a finished run, and transformers restores the optimizer's
   learning rate as the old schedule left it: at its end, 0 for the linear default. The first
   added step trained at 0 (and its rollouts were spent for nothing). The schedule's function
   is built for the new total, so after loading, each group's rate is set to that function's
   value at the restored step: the added steps continue the schedule the new total describes.
3. A step whose learning rate is 0 (a warmup's first, an old schedule's end, `learning_rate 0`)
   still costs its rollouts, so every run says so when it happens.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
_NUMBERED = re.compile(r"^checkpoint-(\d+)$")


def check_resumed_step(checkpoint: Path, max_steps: int) -> int:
    """Return the step `checkpoint` resumes at, or refuse one that cannot be its own.

    A step equal to `max_steps` is a finished run (or one killed before its `final/` was
    written): nothing trains and `final/` is written from the checkpoint, as said in a warning.

    Raises:
        ValueError: naming the file and `global_step`: not a whole number >= 0, another step
            than the folder's name says, or past `max_steps` (with the fix).

    """
    path = checkpoint / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path} cannot be read ({exc}); resume from another checkpoint") from None
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(
            f"{path}: global_step {str(step)[:40]} is not a whole number >= 0; the file was "
            "edited or torn: resume from another checkpoint"
        )
    named = _NUMBERED.match(checkpoint.name)
    if named and int(named.group(1)) != step:
        raise ValueError(
            f"{path}: global_step {step} is not the step of {checkpoint.name}; the file was "
            "edited or belongs to another checkpoint: restore it, or resume from another one"
        )
    if step > max_steps:
        raise ValueError(
            f"{path}: global_step {step} is past max_steps {max_steps}, so nothing would "
            f"train; give --max_steps above {step} to extend the run, or resume from an "
            "earlier checkpoint"
        )
    if step == max_steps:
        logger.warning(
            "%s is at max_steps %d: nothing to train; the final policy is written from it "
            "(give a larger --max_steps to extend the run)",
            checkpoint,
            max_steps,
        )
    return step


def rebuild_schedule(scheduler: Any) -> None:
    """Set each optimizer group's learning rate to the schedule's at its restored step.

    `scheduler` was built for this run's total steps and then loaded from a checkpoint: its
    step and base rates are the checkpoint's, its function this run's. A schedule that is not
    a function of the step (`reduce_lr_on_plateau`) is left as loaded.
    """
    from torch.optim.lr_scheduler import LambdaLR

    inner = getattr(scheduler, "scheduler", scheduler)  # accelerate's wrapper holds it
    if not isinstance(inner, LambdaLR):
        return
    step = inner.last_epoch
    rates = [base * rule(step) for base, rule in zip(inner.base_lrs, inner.lr_lambdas, strict=True)]
    for group, rate in zip(inner.optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    inner._last_lr = rates  # what get_last_lr, and so the logged learning_rate, reports


def warn_if_not_learning(optimizer: Any, step: int) -> bool:
    """Warn when every learning rate of the coming update is 0; return whether it warned."""
    rates = [float(group.get("lr", 0.0)) for group in getattr(optimizer, "param_groups", ())]
    if not rates or max(rates) > 0:
        return False
    logger.warning(
        "step %d trains at learning rate 0: its rollouts cost their time and change no "
        "weight (a warmup's first step, a schedule at its end, or learning_rate 0)",
        step,
    )
    return True
