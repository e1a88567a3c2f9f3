"""Trajectories: one rollout with its outcome, an append-only JSONL store, Parquet export.

Every text of a trajectory is redacted (`flowlearn.secrets.redact_record`) where it is
serialised, `to_json` and `to_table`: the one place every written rollout passes, whatever graph
made it (flowlearn's, whose executor redacts tool results before memory, or a user's, whose
tools' text reaches the record unchecked). Token ids, logprobs and rewards are numbers and are
written exactly.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, cast

from flowlearn.engine.sampling import token_problem
from flowlearn.errors import DataError
from flowlearn.files import JsonlFile, write_atomically
from flowlearn.nodes.schema.records import Transition
from flowlearn.secrets import redact_record

SCHEMA_VERSION = 2
"""2: `steps` became `turns` (planner turns); version-1 records still load."""

DROPPED = "dropped"
"""A trajectory whose `metadata[DROPPED]` is set (the reason) is left out of training, counted."""

# Nested fields go to Parquet as JSON text: memory records and transitions vary in shape, and
# Arrow's struct inference would add nulls for missing keys, so a round trip would not be exact.
_JSON_COLUMNS = ("reference", "reward_terms", "memory", "transitions", "context", "metadata")


@dataclass
class Trajectory:
    """One rollout of the flow on one question, with its outcome and reward."""

    trajectory_id: str
    group_id: str
    question: str
    reference: Any
    answer: str
    final_text: str
    reward: float
    """The outcome: the case's scorer applied to `answer` (in [0, 1]), or TRL-style reward
    functions' weighted sum (`flowlearn.training.rewards`); any finite number."""
    reward_terms: dict[str, float] = field(default_factory=dict)
    """Extra reward terms (e.g. a format penalty), kept apart; `total_reward` adds them."""
    reward_reason: str = ""
    reward_error: str | None = None
    """Set when the scorer failed; the trajectory is kept and marked."""
    turns: int = 0
    """Planner turns taken, format errors included."""
    termination: str | None = None
    seconds: float = 0.0
    memory: list[dict[str, Any]] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    context: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    @property
    def total_reward(self) -> float:
        """The reward plus every extra term: what the advantage is computed from."""
        return self.reward + sum(self.reward_terms.values())

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-serializable dict (transitions included), its texts as they are."""
        return asdict(self)

    def to_record(self) -> dict[str, Any]:
        """Return `to_dict` with every text redacted: the form a trajectory is written in."""
        record: dict[str, Any] = redact_record(self.to_dict())
        return record

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """Rebuild a trajectory from `to_dict` output, checking the schema version.

        Raises:
            DataError: a reward, reward term or logged logprob that is not a finite number, or
                a token id or logprob no policy samples (`bad_token_field`), named by field
                and checked before anything else is built.
            ValueError: a newer schema version than this code reads, or missing fields.

        """
        check_finite_fields(data)
        version = data.get("schema_version", SCHEMA_VERSION)
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"trajectory schema version {version} is newer than this flowlearn reads "
                f"({SCHEMA_VERSION}); upgrade flowlearn"
            )
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if version < 2 and "steps" in data:
            values["turns"] = data["steps"]
        values["schema_version"] = SCHEMA_VERSION
        values["transitions"] = [cast(Transition, dict(t)) for t in values.get("transitions", [])]
        return cls(**values)

    def to_json(self) -> str:
        """Return the trajectory as one JSON line, its texts redacted (`to_record`)."""
        return json.dumps(self.to_record(), ensure_ascii=False, default=str)


def _is_finite_number(value: Any) -> bool:
    """Whether `value` is a real number JSON can hold: an int or float, not a bool, finite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


MAX_REWARD = 1e6
"""The largest reward (or reward term) in size: 1e308 is finite, yet a group's spread of such
rewards overflows to infinity and its advantages to NaN. Scorers give [0, 1]."""


def _is_reward(value: Any) -> bool:
    """Whether `value` is a finite real number no larger than `MAX_REWARD` in size."""
    return _is_finite_number(value) and abs(value) <= MAX_REWARD


def non_finite_field(data: Mapping[str, Any]) -> str | None:
    """Return `field = value` for the first reward or reward term that is not finite.

    None when every one is a finite real number. (Logprobs are `bad_token_field`'s.)

    These are what the advantage is computed from: one NaN, infinity (JSON's `Infinity`, or
    `1e999`, which overflows to it), string or bool there turns a whole group's update into
    NaN or a crash, so it must never reach the trainer.
    """
    if "reward" in data and not _is_reward(data["reward"]):  # a missing one: not a record
        return f"reward = {data.get('reward')!r}"
    terms = data.get("reward_terms") or {}
    if not isinstance(terms, Mapping):
        return f"reward_terms = {terms!r}"
    for name, value in terms.items():
        if not _is_reward(value):
            return f"reward_terms.{name} = {value!r}"
    return None


TOKEN_RULE = (
    "token ids must be whole numbers >= 0 within the policy's vocabulary, and logprobs finite "
    "numbers <= 0, as a policy samples them; a record that breaks this was not written by the "
    "model being trained (a server serving another model, or an edited file)"
)
"""Why a recorded id or logprob is refused, for the messages that refuse one."""


def bad_token_field(data: Mapping[str, Any], vocab_size: int | None = None) -> str | None:
    """Return `transitions[i].field = value (why)` for the first id or logprob not to train on.

    None when every transition's ids and logprobs pass `engine.sampling.token_problem`, the
    rule a served policy's reply is checked by where it arrives; without `vocab_size` ids are
    only checked to be whole numbers >= 0 (a trajectory file does not say its vocabulary).
    """
    transitions = data.get("transitions") or []
    for i, transition in enumerate(transitions if isinstance(transitions, list) else []):
        problem = token_problem(transition, vocab_size) if isinstance(transition, Mapping) else None
        if problem is not None:
            return f"transitions[{i}].{problem}"
    return None


def check_finite_fields(data: Mapping[str, Any]) -> None:
    """Refuse a trajectory record whose rewards, token ids or logprobs training must not use.

    Raises:
        DataError: naming the field and its value.

    """
    bad = non_finite_field(data)
    if bad is not None:
        raise DataError(
            f"field {bad} is not a finite number within ±{MAX_REWARD:g}; a reward must be a "
            "real number (the scorer's value in [0, 1]), never NaN, Infinity, a string or a "
            "bool, nor so large that its group's spread overflows. Fix or remove the record"
        )
    bad = bad_token_field(data)
    if bad is not None:
        raise DataError(f"field {bad}: {TOKEN_RULE}. Fix or remove the record")


def check_trajectories(trajectories: Iterable[Trajectory]) -> None:
    """Refuse in-memory trajectories with a non-finite reward, or a bad token id or logprob.

    Raises:
        DataError: naming the trajectory and field.

    """
    for trajectory in trajectories:
        rewards = {"reward": trajectory.reward, "reward_terms": trajectory.reward_terms}
        bad = non_finite_field(rewards)
        if bad is not None:
            raise DataError(
                f"trajectory {trajectory.trajectory_id!r}: field {bad} is not a finite number "
                f"within ±{MAX_REWARD:g}; it would turn its group's advantages into NaN"
            )
        bad = bad_token_field({"transitions": trajectory.transitions})
        if bad is not None:
            raise DataError(f"trajectory {trajectory.trajectory_id!r}: field {bad}: {TOKEN_RULE}")


def trajectory_from_state(
    state: dict[str, Any],
    *,
    trajectory_id: str,
    group_id: str,
    reference: Any,
    context: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
) -> Trajectory:
    """Turn the flow's final state into an (as yet unrewarded) trajectory.

    Raises:
        TypeError: an answer that is not text (a graph's `answer=` function returning another
            object), rather than its `repr` scored and stored as the answer.

    """
    answer = state.get("answer", "")
    if not isinstance(answer, str):
        raise TypeError(
            f"the graph's answer is of type {type(answer).__name__}, not text: make the final "
            "state's answer (trainable_graph's answer= function) a string"
        )
    transitions = [
        cast(Transition, {**t, "trajectory_id": trajectory_id, "group_id": group_id})
        for t in state.get("transitions", [])
    ]
    return Trajectory(
        trajectory_id=trajectory_id,
        group_id=group_id,
        question=state.get("question", ""),
        reference=reference,
        answer=answer,
        final_text=state.get("final_text", ""),
        reward=0.0,
        turns=state.get("turn", 0),
        termination=state.get("termination"),
        seconds=state.get("seconds", 0.0),
        memory=[dict(r) for r in state.get("memory", [])],
        transitions=transitions,
        context=context or {},
        metadata=metadata or {},
    )


class TrajectoryStore:
    """One trajectory per line, appended durably (`JsonlFile`) as each rollout finishes.

    A crash loses at most the trajectory being written: the next append cuts its torn line
    off first, and a load skips any undecodable line with a warning.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._file = JsonlFile(path)
        self.path = self._file.path

    def append(self, trajectory: Trajectory) -> None:
        """Write one trajectory and fsync it.

        Raises:
            DataError: a NaN, infinite or non-numeric reward (or reward term, or logprob): it
                would turn every advantage of its group into NaN, so it is refused before
                anything is written; so is a token id or logprob no policy samples.

        """
        bad = bad_token_field({"transitions": trajectory.transitions})
        if bad is not None:
            raise DataError(f"trajectory {trajectory.trajectory_id!r}: field {bad}: {TOKEN_RULE}")
        try:
            check_trajectories([trajectory])
        except DataError as exc:
            raise DataError(
                f"{exc}; make the scorer return a number in [0, 1] (or raise, to mark it)"
            ) from None
        self._file.append_line(trajectory.to_json())

    def __iter__(self) -> Iterator[Trajectory]:
        """Yield the stored trajectories in write order, skipping lines torn by a crash.

        Raises:
            DataError: a line that is JSON but not a trajectory, or whose reward, reward term
                or logprob is not a finite number (named by file, line and field), or a file in
                which no line is a trajectory at all.

        """
        torn: list[int] = []
        read = 0
        seen: set[str] = set()
        for number, data in self._file.read(skipped=torn):
            if not isinstance(data, dict):
                raise DataError(
                    f"{self.path}:{number} is not a flowlearn trajectory (a JSON "
                    f"{type(data).__name__}, not an object)"
                )
            try:
                trajectory = Trajectory.from_dict(data)
            except DataError as exc:
                raise DataError(f"{self.path}:{number}: {exc}") from None
            except (ValueError, TypeError, AttributeError) as exc:
                raise DataError(
                    f"{self.path}:{number} is not a flowlearn trajectory ({exc}); "
                    "give a file written by `flowlearn collect` or `TrajectoryStore`"
                ) from exc
            read += 1
            if trajectory.trajectory_id in seen:  # a duplicated line would shift the advantages
                warnings.warn(
                    f"{self.path}:{number}: trajectory {trajectory.trajectory_id!r} appears "
                    "again; the first copy is kept",
                    stacklevel=2,
                )
                continue
            seen.add(trajectory.trajectory_id)
            yield trajectory
        if torn and not read:
            raise DataError(
                f"{self.path} has no readable trajectory ({len(torn)} unreadable lines); it is "
                "not a trajectory JSONL file: give one written by `flowlearn collect`"
            )

    def load(self) -> list[Trajectory]:
        """Return every readable trajectory, in write order."""
        return list(self)

    def ids(self) -> set[str]:
        """Return the ids of the stored trajectories."""
        return {t.trajectory_id for t in self}


def to_table(trajectories: Iterable[Trajectory]) -> Any:
    """Return a `pyarrow.Table`, one row per trajectory, nested fields as JSON text, redacted."""
    import pyarrow as pa

    rows = []
    for trajectory in trajectories:
        row = trajectory.to_record()
        for column in _JSON_COLUMNS:
            row[column] = json.dumps(row[column], ensure_ascii=False, default=str)
        rows.append(row)
    return pa.Table.from_pylist(rows)


def from_rows(rows: Iterable[dict[str, Any]], *, source: str = "rows") -> list[Trajectory]:
    """Rebuild trajectories from `to_table` rows (Parquet or `datasets`).

    Raises:
        DataError: a row that is not a trajectory, or whose reward, reward term or logprob is
            not a finite number, named as `source` and row number (from 1).

    """
    out = []
    for number, row in enumerate(rows, 1):
        data = dict(row)
        try:
            for column in _JSON_COLUMNS:
                if isinstance(data.get(column), str):
                    data[column] = json.loads(data[column])
            out.append(Trajectory.from_dict(data))
        except DataError as exc:
            raise DataError(f"{source}: row {number}: {exc}") from None
        except (ValueError, TypeError, AttributeError) as exc:
            raise DataError(f"{source}: row {number} is not a trajectory ({exc})") from exc
    return out


def export_parquet(trajectories: Iterable[Trajectory], path: str | os.PathLike[str]) -> Path:
    """Write trajectories to a Parquet file (atomically) and return its path."""
    import pyarrow.parquet as pq

    table = to_table(trajectories)
    return write_atomically(path, lambda tmp: pq.write_table(table, tmp))


def read_parquet(path: str | os.PathLike[str]) -> list[Trajectory]:
    """Read trajectories written by `export_parquet`."""
    import pyarrow.parquet as pq

    return from_rows(pq.read_table(path).to_pylist(), source=str(path))


def to_dataset(trajectories: Iterable[Trajectory]) -> Any:
    """Return a `datasets.Dataset` of the trajectories (needs `pip install datasets`)."""
    import datasets

    return datasets.Dataset(to_table(trajectories))


def from_dataset(dataset: Any) -> list[Trajectory]:
    """Rebuild trajectories from a `datasets.Dataset` made by `to_dataset`."""
    return from_rows(dataset, source="dataset")


def load_trajectories(source: str | os.PathLike[str]) -> list[Trajectory]:
    """Load trajectories from a .jsonl store or a .parquet export."""
    path = Path(source)
    if path.suffix == ".parquet":
        return read_parquet(path)
    if not path.exists():
        raise FileNotFoundError(f"no trajectories at {path}")
    return TrajectoryStore(path).load()
