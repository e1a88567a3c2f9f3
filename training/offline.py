"""Offline training's shape, read from its trajectory file: G and the questions per step.

A file `flowlearn collect --group-size 2` wrote holds groups of 2 rollouts. Trained with the
defaults (G 8, 4 questions a step), a file of fewer than 4 groups ended in a traceback from
inside the trainer unless `--num_generations 2 --questions_per_step 2` were given. The file
says both: G is its largest group, and a step takes at most as many questions as it holds.
A value the user gave is kept, and one that cannot work is refused in one line naming the flag.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from flowlearn.training.config import FlowGRPOConfig, parse_config
from flowlearn.training.trajectories import load_trajectories


def given_keys(argv: Sequence[str]) -> set[str]:
    """Return the config keys `argv` sets: its flags and its `--config` file's keys."""
    import yaml

    keys = {a.lstrip("-").split("=")[0].replace("-", "_") for a in argv if a.startswith("--")}
    if "--config" in argv[:-1]:
        path = Path(argv[list(argv).index("--config") + 1])
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}  # checked by parse_config
        keys |= {str(key) for key in loaded} if isinstance(loaded, dict) else set()
    return keys


def fit_offline_shape(
    config: FlowGRPOConfig, argv: Sequence[str]
) -> tuple[FlowGRPOConfig, list[str]]:
    """Return `config` with G and the questions per step its trajectory file implies, and why.

    `num_generations` not given becomes the file's largest group; `questions_per_step` not
    given is lowered to the file's number of groups. The second value names each change.

    Raises:
        ValueError: a file without trajectories, or a `questions_per_step` given above the
            number of groups it holds (one line, naming the flag).

    """
    if not config.trajectories:
        return config, []
    file = config.trajectories
    sizes = Counter(t.group_id for t in load_trajectories(str(file)))
    if not sizes:
        raise ValueError(f"--trajectories {file} holds no trajectories to train on")
    groups, size = len(sizes), max(sizes.values())
    given = given_keys(argv)
    changes: dict[str, int] = {}
    if "num_generations" not in given and config.num_generations != size:
        changes["num_generations"] = size
    if config.questions_per_step > groups:
        if "questions_per_step" in given:
            raise ValueError(
                f"--trajectories {file} holds {groups} groups (questions), fewer than "
                f"questions_per_step {config.questions_per_step}; give --questions_per_step "
                f"{groups} or fewer"
            )
        changes["questions_per_step"] = groups
    if not changes:
        return config, []
    flags = [part for key, value in changes.items() for part in (f"--{key}", str(value))]
    said = [f"{key} {value}" for key, value in changes.items()]
    why = f"read from {file} (groups of up to {size} rollouts, {groups} groups): {', '.join(said)}"
    return parse_config([*argv, *flags]), [why]
