"""Output folders and stores that belong to their run: a marker, a settings record, refusals.

Why it looks like this:
1. `train`, `eval` and `collect` write into a folder (or, for `collect`, a JSONL store) the
   user names. A fresh run once deleted a user's `final/`, replaced their README.md and mixed
   its checkpoint files into theirs. So every output carries a marker, `flowlearn-run.json`
   (beside a store: `STORE.jsonl.flowlearn-run.json`), naming the command and a run id; a
   non-empty folder or store without one was not made by flowlearn and is refused, never
   cleaned up. The filesystem root, the home folder and a project tree are refused outright.
2. The marker records the settings the run's results depend on (data, scorer, models,
   prompts, turns, sampling). A rerun reuses what is there only when they match; otherwise it
   is refused with the difference named, so a report never counts another run's results.
3. The marker is created with `link(2)` from a finished temporary file: it appears whole, and
   only once when several processes of one job (`accelerate launch`) claim the folder at once.
   Another process's temporary marker (`.flowlearn-run.json.*.tmp`), or its marker appearing
   between the first look and the listing, does not make the folder "not empty": two ranks of
   one job once refused each other's folder in those windows.
"""

from __future__ import annotations

import json
import os
import tempfile
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from flowlearn.errors import UsageError
from flowlearn.files import write_text_atomically

MARKER = "flowlearn-run.json"
"""The run marker's file name inside an output folder (and the suffix beside a store)."""

PROJECT_FILES = ("pyproject.toml", ".git", "setup.py", "package.json")
"""Files that say a folder holds a project; a run never writes into one it did not make."""


def store_marker(store: Path) -> Path:
    """Return the marker file of a JSONL store: `STORE.jsonl.flowlearn-run.json` beside it."""
    return store.with_name(f"{store.name}.{MARKER}")


def read_marker(path: Path) -> dict[str, Any] | None:
    """Return the marker at `path`, or None when there is none.

    A marker is what `_create_marker` writes: a command and a run id. A file of one's own
    that only looks like one (`{"command": "eval"}`) would otherwise make its folder adopted
    and its files overwritten.

    Raises:
        UsageError: a file that is not a marker, named, rather than a silent new run.

    """
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not a flowlearn run marker ({exc}); move it aside") from None
    if not isinstance(record, dict) or not isinstance(record.get("command"), str):
        raise UsageError(f"{path} is not a flowlearn run marker (no command); move it aside")
    if not isinstance(record.get("run_id"), str) or not record["run_id"]:
        raise UsageError(
            f"{path} is not a marker flowlearn wrote (no run_id); move it aside, or give "
            "another folder (nothing in this one is overwritten)"
        )
    return record


def refuse_unsafe_folder(folder: Path, flag: str) -> None:
    """Refuse the filesystem root, the home folder and (unless it is a run's) a project tree.

    Raises:
        UsageError: naming the folder and the fix.

    """
    resolved = folder.expanduser().resolve()
    if resolved == Path(resolved.anchor):
        raise UsageError(f"{flag} {folder} is the filesystem root; give a folder of its own")
    if resolved == Path.home().resolve():
        raise UsageError(f"{flag} {folder} is your home folder; give a folder of its own")
    found = [name for name in PROJECT_FILES if (resolved / name).exists()]
    if found and not (resolved / MARKER).exists():
        raise UsageError(
            f"{flag} {folder} holds a project ({', '.join(found)}); a run writes only into a "
            "folder of its own: give a new one, e.g. runs/NAME"
        )


def claim_folder(
    folder: Path,
    command: str,
    settings: Mapping[str, Any] | None = None,
    *,
    flag: str = "--out",
    adopt: Collection[str] = (),
    free_to_change: Collection[str] = (),
    create: bool = True,
) -> dict[str, Any] | None:
    """Make `folder` this run's output folder, or refuse it; return its marker.

    A missing or empty folder is created and marked. A marked one is reused when the marker
    names `command` and its settings match `settings` (keys in `free_to_change` may differ:
    they change which work is done, not how). An unmarked folder holding a file named in
    `adopt` (a record an older flowlearn wrote, e.g. training's `run.json`) is marked and
    reused. Anything else is refused. With `create=False` only the checks run (before any
    work starts) and nothing is written; None comes back where a marker would be created.

    Raises:
        UsageError: a foreign, unsafe or differently-set-up folder, naming it and the fix.

    """
    refuse_unsafe_folder(folder, flag)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {folder} is a file; give a folder")
    marker_path = folder / MARKER
    marker = read_marker(marker_path)
    if marker is None:
        entries = sorted(
            p.name
            for p in (folder.iterdir() if folder.is_dir() else ())
            if not _pending(p.name) and p.name != MARKER  # another process's, just made
        )
        if entries and not any(name in adopt for name in entries):
            shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
            raise UsageError(
                f"{flag} {folder} is not empty ({shown}) and was not made by flowlearn "
                f"{command} (no {MARKER}); give a new folder (nothing in it is deleted or "
                "overwritten)"
            )
        marker = read_marker(marker_path)  # made by another process of the job meanwhile
    if marker is None:
        if not create:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        marker = _create_marker(marker_path, command, settings)
    return _check_marker(marker, marker_path, command, settings, flag, free_to_change)


def claim_store(
    store: Path,
    command: str,
    settings: Mapping[str, Any] | None = None,
    *,
    flag: str = "--out",
    free_to_change: Collection[str] = (),
) -> dict[str, Any]:
    """Make the JSONL file `store` this run's store, or refuse it; return its marker.

    A missing or empty store is marked (`store_marker`); a non-empty one is appended to only
    when its marker names `command` and settings that match.

    Raises:
        UsageError: a file flowlearn did not make, or made with other settings.

    """
    if store.is_dir():
        raise UsageError(f"{flag} {store} is a folder; give a .jsonl file path")
    marker_path = store_marker(store)
    marker = read_marker(marker_path)
    if marker is None:
        if store.exists() and store.stat().st_size:
            raise UsageError(
                f"{flag} {store} is not empty and is not a flowlearn {command} store (no "
                f"{marker_path.name} beside it); give a new file (nothing in it is "
                "overwritten)"
            )
        store.parent.mkdir(parents=True, exist_ok=True)
        marker = _create_marker(marker_path, command, settings)
    return _check_marker(marker, marker_path, command, settings, flag, free_to_change)


def settings_diff(
    before: Mapping[str, Any], now: Mapping[str, Any], *, ignore: Collection[str] = ()
) -> list[str]:
    """Name every setting whose recorded value differs from the current one, as `key a, now b`."""
    keys = [k for k in dict.fromkeys([*before, *now]) if k not in ignore]
    return [
        f"{key} {before.get(key)!r}, now {now.get(key)!r}"
        for key in keys
        if before.get(key) != now.get(key)
    ]


def _check_marker(
    marker: dict[str, Any],
    marker_path: Path,
    command: str,
    settings: Mapping[str, Any] | None,
    flag: str,
    free_to_change: Collection[str],
) -> dict[str, Any]:
    where = marker_path.parent if marker_path.name == MARKER else marker_path
    if marker["command"] != command:
        raise UsageError(
            f"{flag} {where} belongs to a flowlearn {marker['command']} run "
            f"({marker.get('run_id')}); give a folder of this {command} run's own"
        )
    if settings is None:
        return marker
    now = _as_json(settings)
    before = marker.get("settings")
    if not isinstance(before, dict):  # eval and collect write theirs with the marker
        raise UsageError(
            f"{flag} {where}: its {marker_path.name} records no settings, so it is not a "
            f"marker of a flowlearn {command} run; give a new one (nothing in it is "
            "overwritten)"
        )
    diff = settings_diff(before, now, ignore=free_to_change)
    if diff:
        raise UsageError(
            f"{flag} {where} holds the results of run {marker.get('run_id')}, made with other "
            f"settings ({'; '.join(diff)}); rerun with those settings to resume it, or give a "
            "new one (nothing is mixed or overwritten)"
        )
    if any(before.get(k) != now.get(k) for k in free_to_change):
        marker = {**marker, "settings": {**before, **now}}
        write_text_atomically(marker_path, json.dumps(marker, indent=1) + "\n")
    return marker


def _pending(name: str) -> bool:
    """Say whether `name` is a marker another process is writing (see `_create_marker`)."""
    return name.startswith(f".{MARKER}.") and name.endswith(".tmp")


def _create_marker(path: Path, command: str, settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Write a new marker whole, unless another process of the job got there first."""
    record: dict[str, Any] = {"command": command, "run_id": uuid.uuid4().hex[:12]}
    if settings is not None:
        record["settings"] = _as_json(settings)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(json.dumps(record, indent=1) + "\n")
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(name, path)  # atomic, and fails when the marker exists
        except FileExistsError:
            found = read_marker(path)
            assert found is not None
            return found
    finally:
        Path(name).unlink(missing_ok=True)
    return record


def _as_json(settings: Mapping[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(dict(settings), default=str))
    return loaded
