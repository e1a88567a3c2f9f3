"""An append-only JSONL store of trajectories, and lossless Parquet / `datasets` export."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from flowlearn.training.trajectory import Trajectory

logger = logging.getLogger(__name__)

# Nested fields go to Parquet as JSON text: memory records and transitions vary in shape, and
# Arrow's struct inference would add nulls for missing keys, so a round trip would not be exact.
_JSON_COLUMNS = ("reference", "reward_terms", "memory", "transitions", "context", "metadata")


class TrajectoryStore:
    """One trajectory per line, appended and flushed to disk as each rollout finishes.

    A crash loses at most the trajectory being written; a torn last line is skipped on load
    with a warning, and the next append starts on a fresh line.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a folder; give a .jsonl file path")
        self._lock = threading.Lock()

    def append(self, trajectory: Trajectory) -> None:
        """Write one trajectory and fsync it."""
        line = trajectory.to_json() + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a+b") as handle:
                handle.seek(0, os.SEEK_END)
                if handle.tell() > 0:
                    handle.seek(-1, os.SEEK_END)
                    if handle.read(1) != b"\n":  # a torn line from a crash: close it off
                        handle.write(b"\n")
                handle.write(line.encode("utf-8"))
                handle.flush()
                os.fsync(handle.fileno())

    def __iter__(self) -> Iterator[Trajectory]:
        """Yield the stored trajectories in write order, skipping lines torn by a crash.

        Raises:
            ValueError: a line that is JSON but not a trajectory (named by file and line), or
                a file in which no line is a trajectory at all.

        """
        if not self.path.exists():
            return
        lines = self.path.read_bytes().split(b"\n")
        read, torn = 0, 0
        for number, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            try:
                data = json.loads(raw)
            except ValueError as exc:
                # A line torn by a crash (appends after it start on a fresh line).
                torn += 1
                logger.warning("%s:%d: skipping a torn line (%s)", self.path, number, exc)
                continue
            try:
                trajectory = Trajectory.from_dict(data)
            except (ValueError, TypeError, AttributeError) as exc:
                raise ValueError(
                    f"{self.path}:{number} is not a flowlearn trajectory ({exc}); "
                    "give a file written by `flowlearn collect` or `TrajectoryStore`"
                ) from exc
            read += 1
            yield trajectory
        if torn and not read:
            raise ValueError(
                f"{self.path} has no readable trajectory ({torn} unreadable lines); it is not "
                "a trajectory JSONL file: give one written by `flowlearn collect`"
            )

    def load(self) -> list[Trajectory]:
        """Return every readable trajectory, in write order."""
        return list(self)

    def ids(self) -> set[str]:
        """Return the ids of the stored trajectories."""
        return {t.trajectory_id for t in self}


def to_table(trajectories: Iterable[Trajectory]) -> Any:
    """Return a `pyarrow.Table`, one row per trajectory, nested fields as JSON text."""
    import pyarrow as pa

    rows = []
    for trajectory in trajectories:
        row = trajectory.to_dict()
        for column in _JSON_COLUMNS:
            row[column] = json.dumps(row[column], ensure_ascii=False, default=str)
        rows.append(row)
    return pa.Table.from_pylist(rows)


def from_rows(rows: Iterable[dict[str, Any]]) -> list[Trajectory]:
    """Rebuild trajectories from `to_table` rows (Parquet or `datasets`)."""
    out = []
    for row in rows:
        data = dict(row)
        for column in _JSON_COLUMNS:
            if isinstance(data.get(column), str):
                data[column] = json.loads(data[column])
        out.append(Trajectory.from_dict(data))
    return out


def export_parquet(trajectories: Iterable[Trajectory], path: str | os.PathLike[str]) -> Path:
    """Write trajectories to a Parquet file (atomically) and return its path."""
    import pyarrow.parquet as pq

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    pq.write_table(to_table(trajectories), tmp)
    os.replace(tmp, target)
    return target


def read_parquet(path: str | os.PathLike[str]) -> list[Trajectory]:
    """Read trajectories written by `export_parquet`."""
    import pyarrow.parquet as pq

    return from_rows(pq.read_table(path).to_pylist())


def to_dataset(trajectories: Iterable[Trajectory]) -> Any:
    """Return a `datasets.Dataset` of the trajectories (needs `pip install datasets`)."""
    import datasets

    return datasets.Dataset(to_table(trajectories))


def from_dataset(dataset: Any) -> list[Trajectory]:
    """Rebuild trajectories from a `datasets.Dataset` made by `to_dataset`."""
    return from_rows(dataset)


def load_trajectories(source: str | os.PathLike[str]) -> list[Trajectory]:
    """Load trajectories from a .jsonl store or a .parquet export."""
    path = Path(source)
    if path.suffix == ".parquet":
        return read_parquet(path)
    if not path.exists():
        raise FileNotFoundError(f"no trajectories at {path}")
    return TrajectoryStore(path).load()
