"""A child process for the kill -9 training test: `flowlearn train` that kills itself, SIGKILL,
while saving checkpoint KILL_AT, after its weights are written and before its trainer state is.

The kill point is fixed, so the test means the same on any machine: the run is torn mid-save,
the checkpoint before it is the last complete one, and the run has not finished.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from transformers.trainer_callback import TrainerState

from flowlearn.cli import main


def kill_while_saving(step: int) -> None:
    save = TrainerState.save_to_json

    def save_or_die(self: TrainerState, json_path: str) -> None:
        if Path(json_path).parent.name == f"checkpoint-{step}":
            os.kill(os.getpid(), signal.SIGKILL)
        save(self, json_path)

    TrainerState.save_to_json = save_or_die  # type: ignore[method-assign]


if __name__ == "__main__":
    kill_while_saving(int(sys.argv[1]))
    sys.exit(main(["train", "--config", sys.argv[2]]))
