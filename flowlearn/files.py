"""Files a crash cannot corrupt: one durable JSONL appender and one atomic-write helper.

Every JSONL file the package appends to (trajectory stores, eval results, saved runs, training
metrics) goes through `JsonlFile`, and every file or folder it replaces whole (reports, plots,
Parquet exports, final models) goes through `write_atomically` or `save_atomically`.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

logger = logging.getLogger(__name__)

_CHUNK = 1 << 16


class JsonlFile:
    """An append-only JSONL file: one record per line, each flushed and fsynced when written.

    A crash mid-write leaves a torn last line (no newline). The next `append` repairs it first:
    a tail that is not JSON is cut off, a whole record missing only its newline gets one, so a
    new record is never glued onto a broken one. `read` skips undecodable lines with a warning
    naming file and line.

    Several processes may append to one file: each append holds an exclusive advisory lock
    (`flock`) on the file across repair and write, so a repair never cuts a record another
    writer is still writing (without it, two writers lost 1-3% of large records). A tail the
    lock's holder finds torn was left by a writer that died.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a folder; give a .jsonl file path")
        self._lock = threading.Lock()

    def append(self, record: Any, *, default: Callable[[Any], Any] = str) -> None:
        """Write `record` as one JSON line (`default` converts what JSON cannot hold), durably."""
        self.append_line(json.dumps(record, ensure_ascii=False, default=default))

    def append_line(self, line: str) -> None:
        """Write one already-encoded JSON line (no newline inside it), durably."""
        if "\n" in line:
            raise ValueError("a JSONL record must not contain a newline")
        data = line.encode("utf-8") + b"\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _locked(self.path) as handle:
                _repair_torn_tail(handle, self.path)
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())

    def read(self, *, skipped: list[int] | None = None) -> Iterator[tuple[int, Any]]:
        """Yield `(line number, decoded JSON)` in write order; nothing when there is no file.

        Blank lines are passed over; an undecodable line (torn by a crash, or a reader racing
        a writer) is skipped with a warning, and its number added to `skipped` when given.
        """
        if not self.path.exists():
            return
        with self.path.open("rb") as handle:
            for number, raw in enumerate(handle, 1):
                if not raw.strip():
                    continue
                try:
                    data = json.loads(raw)
                except ValueError as exc:
                    logger.warning(
                        "%s:%d: skipping an undecodable line (torn by an interrupted write?): %s",
                        self.path,
                        number,
                        exc,
                    )
                    if skipped is not None:
                        skipped.append(number)
                    continue
                yield number, data

    def records(self) -> list[Any]:
        """Return every decodable record, in write order."""
        return [data for _, data in self.read()]

    def rewrite(self, records: Iterable[Any], *, default: Callable[[Any], Any] = str) -> None:
        """Replace the whole file with `records`, atomically."""
        text = "".join(json.dumps(r, ensure_ascii=False, default=default) + "\n" for r in records)
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with _locked(self.path):  # no other process is mid-append while the file is swapped
                write_text_atomically(self.path, text)


@contextmanager
def _locked(path: Path) -> Iterator[BinaryIO]:
    """Open `path` for appending, holding an exclusive `flock` on it until the block ends.

    A writer that opened the file just before a `rewrite` swapped a new one in holds a lock on
    a file no longer at `path`; it opens the path again, so its record lands in the new file.
    """
    while True:
        handle = path.open("a+b")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)  # released when the handle closes
            opened = os.fstat(handle.fileno())
            try:
                current = os.stat(path)
            except FileNotFoundError:
                current = None
            if current is not None and (current.st_dev, current.st_ino) == (
                opened.st_dev,
                opened.st_ino,
            ):
                yield handle
                return
        finally:
            handle.close()


def _repair_torn_tail(handle: BinaryIO, path: Path) -> None:
    """Make the file end with a newline: complete a whole last record, cut a torn one."""
    end = handle.seek(0, os.SEEK_END)
    if end == 0:
        return
    handle.seek(end - 1)
    if handle.read(1) == b"\n":
        return
    start = _last_line_start(handle, end)
    handle.seek(start)
    tail = handle.read(end - start)
    try:
        json.loads(tail)
    except ValueError:
        handle.truncate(start)
        logger.warning(
            "%s: cut off a torn last line (%d bytes from an interrupted write) before appending",
            path,
            end - start,
        )
        return
    handle.write(b"\n")


def _last_line_start(handle: BinaryIO, end: int) -> int:
    """Return the offset just past the last newline before `end` (0 when there is none)."""
    position = end
    while position > 0:
        size = min(_CHUNK, position)
        position -= size
        handle.seek(position)
        newline = handle.read(size).rfind(b"\n")
        if newline >= 0:
            return position + newline + 1
    return 0


def read_capped(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """Return the bytes of the file at `path`, or None when it holds more than `limit`.

    Reads at most `limit + 1` bytes, so a huge file costs no more than a small one.

    Raises:
        OSError: the file cannot be read.

    """
    with open(path, "rb") as handle:
        raw = handle.read(limit + 1)
    return raw if len(raw) <= limit else None


def write_atomically(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call `write(tmp)` on a temporary file beside `path`, fsync it, then swap it in.

    Readers see the old file or the new one, never half of one; if `write` raises, the old
    file is left as it was and the temporary file removed.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(handle)
    tmp = Path(name)
    try:
        write(tmp)
        _fsync_path(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_path(target.parent)
    return target


def write_text_atomically(path: str | os.PathLike[str], text: str) -> Path:
    """Write `text` (UTF-8) to `path` atomically."""
    return write_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def save_atomically(folder: Path, save: Callable[[Path], object], *, replace: bool = True) -> Path:
    """Call `save(staging)` then swap the staging folder in as `folder`.

    A crash leaves either the old folder or the new one, never a mix; the staged files are
    fsynced before the swap. If `save` raises, the old folder is left as it was. Each call
    stages in a fresh folder beside `folder`, so concurrent savers never mix files. With
    `replace=False` an existing `folder` wins: a saver that finds one in place when it is done
    (another process got there first) discards its own copy. With `replace=True` (one writer)
    staging folders an earlier crash left behind are removed first.
    """
    folder.parent.mkdir(parents=True, exist_ok=True)
    if replace:  # one writer: what an earlier crash left staged is garbage
        for stale in folder.parent.glob(f".{folder.name}.partial-*"):
            shutil.rmtree(stale, ignore_errors=True)
    box = Path(tempfile.mkdtemp(prefix=f".{folder.name}.partial-", dir=folder.parent))
    staging = box / folder.name  # `save` creates it, as `save_pretrained` does
    try:
        save(staging)
        for file in staging.rglob("*"):
            if file.is_file():
                _fsync_path(file)
        if folder.exists() and not replace:
            return folder
        if folder.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{folder.name}.old-", dir=folder.parent))
            folder.rename(old / folder.name)
            staging.rename(folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(folder)
    finally:
        shutil.rmtree(box, ignore_errors=True)
    _fsync_path(folder.parent)
    return folder


def _fsync_path(path: Path) -> None:
    """Flush a file's data (or a folder's entries, where the system allows it) to disk."""
    folder = path.is_dir()
    try:
        descriptor = os.open(path, os.O_RDONLY if folder else os.O_RDWR)
    except OSError:
        if folder:  # some systems cannot open a folder for fsync; the rename still holds
            return
        raise
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
