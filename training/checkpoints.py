"""Checkpoints a crash cannot corrupt: resume picks the last complete one.

transformers writes a checkpoint's files in place and `trainer_state.json` last. A process
killed while saving leaves a folder without that file, or with a torn one; resuming from it
would fail or, worse, load half-written weights. So a checkpoint counts only when its state
file parses; an incomplete one is renamed `incomplete-checkpoint-N` (kept for inspection, out
of transformers' way) and training resumes from the one before. Final models are swapped in
whole by `flowlearn.nodes.files.save_atomically`.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

logger = logging.getLogger(__name__)

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


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
