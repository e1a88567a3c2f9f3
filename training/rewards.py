"""TRL's reward functions on whole rollouts, and TRL's datasets as the flow's questions.

A TRL user writes reward functions as `(completions, **kwargs) -> list[float | None]` and
hands `GRPOTrainer` a `datasets.Dataset`. `FlowGRPOTrainer` takes both in that shape:

1. A rollout's "completion" is the flow's final answer (the text inside `<answer>`), not one
   planner turn: Flow-GRPO broadcasts that outcome to every turn. Each function is called
   once per rollout with lists of one item, as TRL calls it per batch: `completions` and
   `prompts` (the answer and the question), `reference` (the dataset's answer column), every
   other column of the question's row, and `trajectories` (the whole `Trajectory`: memory,
   tool calls, transitions). `None` means "does not apply" (TRL's rule); the rest are summed
   with `args.reward_weights`.
2. Our scorers come as such functions (`reward_function("exact_match")`), so TRL code that
   lists reward functions runs unchanged.
3. The dataset's question column is `question`, `query` or TRL's `prompt` (text, or the last
   user message of a conversation); its answer column `answer`, `reference`, `solution` or
   `ground_truth`; `id` names the group (default: the row's index).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Any

from flowlearn.evals.cases import Case, row_to_case
from flowlearn.evals.scorers import SCORERS, Score, scorer_named
from flowlearn.training.trajectories import Trajectory

RewardFunc = Callable[..., list[float | None]]
"""TRL's reward function: `(completions, **kwargs) -> list[float | None]`."""

QUESTION_COLUMNS = ("question", "query", "Question", "prompt")
ANSWER_COLUMNS = ("answer", "reference", "Answer", "solution", "ground_truth")


def reward_function(scorer: str | Callable[[str, Case], Score]) -> RewardFunc:
    """Return a scorer (or a registered scorer's name) as a TRL reward function.

    Raises:
        KeyError: an unknown scorer name, listing the known ones.

    """
    score = scorer_named(scorer) if isinstance(scorer, str) else scorer
    name = scorer if isinstance(scorer, str) else getattr(scorer, "__name__", "scorer")

    def reward(
        completions: Sequence[Any], reference: Sequence[Any], **kwargs: Any
    ) -> list[float | None]:
        prompts = kwargs.pop("prompts", [""] * len(completions))
        kwargs.pop("trajectories", None)
        values: list[float | None] = []
        for i, completion in enumerate(completions):
            metadata = {key: column[i] for key, column in kwargs.items()}
            case = Case(str(i), str(prompts[i]), reference[i], metadata)
            values.append(score(str(completion), case).value)
        return values

    reward.__name__ = f"{name}_reward"
    reward.__qualname__ = reward.__name__
    return reward


SCORER_REWARDS: dict[str, RewardFunc] = {name: reward_function(name) for name in SCORERS}
"""Every registered scorer as a TRL reward function, by the scorer's name."""


@dataclass(frozen=True)
class RewardFunctions:
    """TRL reward functions as the flow's outcome: their weighted sum on each rollout."""

    funcs: tuple[RewardFunc, ...]
    weights: tuple[float, ...]

    @classmethod
    def of(
        cls, funcs: RewardFunc | str | Sequence[RewardFunc | str], weights: Sequence[float] | None
    ) -> RewardFunctions:
        """Check and hold `funcs` (a scorer's name stands for its `reward_function`).

        Raises:
            ValueError: no function, a thing that is not callable, or weights of another
                length than the functions.

        """
        given = [funcs] if isinstance(funcs, str) or callable(funcs) else list(funcs)
        if not given:
            raise ValueError("reward_funcs is empty; give at least one reward function")
        resolved = []
        for func in given:
            if isinstance(func, str):
                if func not in SCORER_REWARDS:
                    raise ValueError(
                        f"reward_funcs names {func!r}: flowlearn takes reward functions, or a "
                        f"scorer's name ({', '.join(sorted(SCORER_REWARDS))}); reward models "
                        "by hub id are not supported"
                    )
                func = SCORER_REWARDS[func]
            if not callable(func):
                raise ValueError(f"reward_funcs holds {func!r}, which is not a function")
            resolved.append(func)
        if weights is None:
            weights = [1.0] * len(resolved)
        if len(weights) != len(resolved):
            raise ValueError(
                f"reward_weights has {len(weights)} values for {len(resolved)} reward functions; "
                "give one weight per function"
            )
        return cls(tuple(resolved), tuple(float(w) for w in weights))

    def score_rollout(self, trajectory: Trajectory, case: Case) -> tuple[float, str]:
        """Return the weighted sum of every function's reward of this rollout.

        Raises:
            ValueError: a function that returned other than one number (or None) for the
                rollout, a non-finite reward, or None from every function; the rollout is
                then marked with the error (`reward_errors`).

        """
        named = {"completions", "prompts", "reference", "trajectories"}
        columns = {key: [value] for key, value in case.metadata.items() if key not in named}
        total, parts = 0.0, []
        for func, weight in zip(self.funcs, self.weights, strict=True):
            name = getattr(func, "__name__", "reward")
            values = list(
                func(
                    completions=[trajectory.answer],
                    prompts=[case.query],
                    reference=[case.reference],
                    trajectories=[trajectory],
                    **columns,
                )
            )
            if len(values) != 1:
                raise ValueError(f"{name} returned {len(values)} rewards for 1 completion")
            if values[0] is None:
                continue
            value = reward_number(values[0], name)
            total += weight * value
            parts.append(f"{name}={value:g}")
        if not parts:
            raise ValueError("every reward function returned None for this rollout")
        return total, ", ".join(parts)


def reward_number(value: object, name: str) -> float:
    """Return a reward function's value as a float: a finite real number, never text or a bool.

    `float("1.0")` and `float(True)` would pass, but trajectory files refuse `"1"` and `true`
    as rewards: a function that returns text has a bug the reward must not hide.

    >>> reward_number(1, "f")
    1.0
    >>> reward_number("1.0", "f")
    Traceback (most recent call last):
    ...
    ValueError: f returned str '1.0', not a number; return a float, or None where it does not apply

    Raises:
        ValueError: naming the function and what it returned.

    """
    if isinstance(value, bool) or type(value).__name__ == "bool_" or not isinstance(value, Real):
        raise ValueError(
            f"{name} returned {type(value).__name__} {str(value)[:40]!r}, not a number; return a "
            "float, or None where it does not apply"
        )
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{name} returned a non-finite reward ({number})")
    return number


def dataset_cases(dataset: Iterable[Mapping[str, Any]]) -> list[Case]:
    """Return the questions of a `datasets.Dataset` (or any rows of mappings) as cases.

    Raises:
        ValueError: a row without a question or an answer column, naming the row and its
            columns; a conversational prompt with no user message.

    """
    cases = []
    for index, row in enumerate(dataset):
        record = dict(row)
        if not any(k in record for k in QUESTION_COLUMNS[:3]) and "prompt" in record:
            record["question"] = _prompt_text(record.pop("prompt"), index)
        for column in ANSWER_COLUMNS[3:]:
            if not any(k in record for k in ANSWER_COLUMNS[:3]) and column in record:
                record["answer"] = record.pop(column)
        cases.append(row_to_case(record, index, where=f"train_dataset row {index}"))
    if not cases:
        raise ValueError("train_dataset has no rows; give at least one question")
    return cases


def _prompt_text(prompt: Any, index: int) -> str:
    if isinstance(prompt, str):
        return prompt
    messages = [m for m in prompt or [] if isinstance(m, Mapping)]
    users = [m.get("content") for m in messages if m.get("role") == "user"]
    if not users or not isinstance(users[-1], str):
        raise ValueError(
            f"train_dataset row {index}: its prompt has no user message with text; the flow "
            "asks the last user message's text as the question"
        )
    return users[-1]
