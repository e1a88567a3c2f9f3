"""The prompt sets by name, and which one a planner gets when none is named.

`FlowSpec.prompt_set` (the CLI, Studio) and `FlowGRPOTrainer` built in TRL's shape choose by
the same rule: the set a trained folder records, else `smollm2` when the planner or the engine
is the embedded default (it is what the shipped planner was trained with), else AgentFlow's.
"""

from __future__ import annotations

from flowlearn.engine import BASE_SOURCE, DEFAULT_SOURCES
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, Prompts, recorded_prompts
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS

PROMPT_SETS: dict[str, Prompts] = {"agentflow": AGENTFLOW_PROMPTS, "smollm2": SMOLLM2_PROMPTS}
"""Every prompt set by the name `--prompts`, `FLOWLEARN_PROMPTS` and `prompts:` take."""


def named_prompts(name: str) -> Prompts:
    """Return the prompt set called `name`.

    Raises:
        ValueError: an unknown name, listing the known ones.

    """
    if name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; choose from {sorted(PROMPT_SETS)}")
    return PROMPT_SETS[name]


def prompts_for(planner: str | None, engine: str | None) -> Prompts:
    """Return the prompt set of a local `planner` (None: served) beside `engine` (None: served).

    Raises:
        ValueError: a planner folder whose recorded set is not one of `PROMPT_SETS`.

    """
    trained = recorded_prompts(planner) if planner is not None else None
    if trained is not None:
        if trained not in PROMPT_SETS:
            raise ValueError(
                f"{planner} was trained under the prompt set {trained!r}, which is not one of "
                f"{sorted(PROMPT_SETS)}; name one with --prompts"
            )
        return PROMPT_SETS[trained]
    embedded = {*DEFAULT_SOURCES, BASE_SOURCE}
    uses_embedded = (planner or "\0").lower() in embedded or (engine or "\0").lower() in embedded
    return SMOLLM2_PROMPTS if uses_embedded else AGENTFLOW_PROMPTS
