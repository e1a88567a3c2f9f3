"""A saved result of several trained nodes: its record of adapters and the fingerprint of its base.

`write_adapters_record` writes `ADAPTERS_RECORD` beside the adapters PEFT saves (the base, each
node's adapter folder, the base's fingerprint); `read_adapters_record` reads it back, refusing a
record whose base is not the one it was trained on (`checked_base`). The adapters themselves are
attached by `engine.adapters.attach_adapters`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from flowlearn.engine.adapters import check_node_name
from flowlearn.engine.loading import BASE_SOURCE, DEFAULT_SOURCES, read_json_record
from flowlearn.errors import SavedModelError, brief

logger = logging.getLogger(__name__)

ADAPTERS_RECORD = "flowlearn_adapters.json"
"""The file in a training result of several nodes that names its base model and its nodes."""


WEIGHT_SAMPLES = 64
"""Evenly spaced reads per weight file in a base's fingerprint."""
SAMPLE_BYTES = 4096
VOLATILE_CONFIG_KEYS = frozenset({"transformers_version", "_name_or_path", "name_or_path"})
"""Keys of a model's config.json that saving it again may change; left out of its hash."""


def embedded(base: str) -> bool:
    """Whether `base` names flowlearn's embedded default model (resolvable anywhere)."""
    return base.lower() in (*DEFAULT_SOURCES, BASE_SOURCE)


def locate_base(base: str, kind: str | None = None) -> tuple[Path | None, str | None]:
    """Return where the model `base` is on this machine and its hub revision, or (None, None).

    A path (a folder or a .gguf file) is made absolute; a hub id is found in the local hub
    cache only (its snapshot folder, whose name is the commit). `kind` "hub" skips the path.
    """
    path = Path(base).expanduser()
    if kind != "hub" and path.exists():
        return path.resolve(), None
    if kind in ("folder", "file") or path.is_absolute() or base.startswith((".", "~")):
        return None, None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(base, "config.json")
    except (ImportError, ValueError):  # an id the hub would refuse
        return None, None
    if not isinstance(found, str):
        return None, None
    return Path(found).parent, Path(found).parent.name


def base_fingerprint(where: Path, revision: str | None = None) -> dict[str, Any]:
    """Fingerprint the model at `where`: its config's hash, vocabulary size and sampled weights.

    The weights are sampled (`WEIGHT_SAMPLES` reads of `SAMPLE_BYTES` spread over each weight
    file, with its name and size), so the fingerprint costs milliseconds for any size of model,
    yet tells apart two models of the same shape: any two trainings differ all over their
    weights. `revision` is the hub commit, when the model came from the hub's cache.
    """
    config: Any = {}
    files = [where]
    if where.is_dir():
        if (where / "config.json").is_file():
            config = read_json_record(where / "config.json", "model config")
        files = sorted(p for p in where.iterdir() if weight_file(p.name))
    config = config if isinstance(config, dict) else {}
    kept = {k: v for k, v in config.items() if k not in VOLATILE_CONFIG_KEYS}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}:{size}\n".encode())
        with open(file, "rb") as handle:
            for k in range(WEIGHT_SAMPLES):
                handle.seek(size * k // WEIGHT_SAMPLES)
                digest.update(handle.read(SAMPLE_BYTES))
    return {
        "config_sha256": hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()
        if where.is_dir()
        else None,
        "vocab_size": config.get("vocab_size") or text.get("vocab_size"),
        "weights_sample_sha256": digest.hexdigest(),
        "revision": revision,
    }


def weight_file(name: str) -> bool:
    """Whether a file of a model folder holds its weights (safetensors, or torch's .bin)."""
    return name.endswith(".safetensors") or (
        name.startswith("pytorch_model") and name.endswith(".bin")
    )


FINGERPRINT_PARTS = {
    "vocab_size": "vocab",
    "config_sha256": "config.json sha256",
    "weights_sample_sha256": "weights sample sha256",
    "revision": "revision",
}


def describe_fingerprint(fingerprint: Mapping[str, Any]) -> str:
    """Say a fingerprint in words: `vocab 400, config.json sha256 1a2b3c4d5e6f, ...`."""
    parts = []
    for key, words in FINGERPRINT_PARTS.items():
        value = fingerprint.get(key)
        if value is not None:
            parts.append(f"{words} {str(value)[:12] if key != 'vocab_size' else value}")
    return ", ".join(parts) or "no fingerprint"


def write_adapters_record(folder: Path, base: str, nodes: Sequence[str]) -> None:
    """Name, in a training result's `folder`, its base model and its nodes' adapters.

    The base is recorded where it resolves from any folder (an absolute path, a hub id, or the
    embedded default's name), with its kind and fingerprint (`base_fingerprint`), or a null
    fingerprint where the base cannot be found here (a hub id not in the local cache).
    """
    located, revision = (None, None) if embedded(base) else locate_base(base)
    kind = "embedded" if embedded(base) else "hub"
    if located is not None and revision is None:
        kind, base = ("folder" if located.is_dir() else "file"), str(located)
    record = {
        "base": base,
        "base_kind": kind,
        "base_fingerprint": None if located is None else base_fingerprint(located, revision),
        "nodes": list(nodes),
    }
    (folder / ADAPTERS_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")


def read_adapters_record(folder: str | os.PathLike[str]) -> tuple[str, dict[str, Path]] | None:
    """Return the base model and each node's adapter folder of a training result, or None.

    None when `folder` is not a result of several nodes (no `ADAPTERS_RECORD`). The base is
    checked against its recorded fingerprint (`checked_base`).

    Raises:
        ValueError: a record that is not one (too large, too deep, not JSON), a node whose
            adapter folder is missing, or a base that is gone or not the model the adapters
            were trained on (`SavedModelError`, a ValueError).

    """
    root = Path(folder).expanduser()
    path = root / ADAPTERS_RECORD
    if not path.is_file():
        return None
    record = read_json_record(path, "record of trained adapters")
    base = record.get("base") if isinstance(record, dict) else None
    nodes = record.get("nodes") if isinstance(record, dict) else None
    if not isinstance(base, str) or not base or not isinstance(nodes, list) or not nodes:
        raise SavedModelError(f"{path} does not name a base and nodes; fix or remove it")
    folders = {check_node_name(node): root / node for node in nodes}
    if len(folders) != len(nodes):  # a dict would keep one of each silently
        twice = [n for n, k in Counter(nodes).items() if k > 1]
        raise SavedModelError(f"{path} names nodes twice: {brief(twice)}; fix or remove it")
    missing = [n for n, f in folders.items() if not (f / "adapter_config.json").is_file()]
    if missing:
        raise ValueError(f"{root} names adapters {brief(missing)} that are not there; incomplete")
    return checked_base(record, path), folders


def checked_base(record: Mapping[str, Any], path: Path) -> str:
    """Return the record's base after checking it is the model the adapters were trained on.

    A record an older flowlearn wrote has no fingerprint and names the base as typed: one
    relative to the folder training ran in is refused when such a path exists here (it may
    well be another model: the case this check exists for); any other loads with a warning.

    Raises:
        SavedModelError: a folder or file base that is gone, a base whose fingerprint differs
            (saying what differs), or an older record's relative base.

    """
    base, kind = record["base"], record.get("base_kind")
    if embedded(base):
        return str(base)
    fix = f'or edit "base" in {path} to where that model is now (it is checked again)'
    if "base_fingerprint" not in record:  # written by an older flowlearn
        return older_base(base, path)
    recorded = record["base_fingerprint"]
    if kind == "hub" and Path(base).expanduser().exists():
        raise SavedModelError(
            f"{path} names the hub model {base}, and a folder {base} here would load instead; "
            "run from another folder"
        )
    located, revision = locate_base(base, kind)
    if located is None and kind != "hub":
        raise SavedModelError(
            f"the base model {base} that the adapters in {path.parent} were trained on is not "
            "there any more (deleted, as a temporary folder is, or the result was copied from "
            f"another machine); put that model back at {base}, {fix}"
        )
    if located is None or not isinstance(recorded, dict):
        logger.warning(
            "%s: its base %s could not be checked (%s); loading it as named",
            path,
            base,
            "no fingerprint was recorded" if located else "not in the local hub cache",
        )
        return str(base)
    current = base_fingerprint(located, revision)
    differs = [
        FINGERPRINT_PARTS[k]
        for k in FINGERPRINT_PARTS
        if recorded.get(k) is not None and recorded.get(k) != current.get(k)
    ]
    if differs:
        raise SavedModelError(
            f"the adapters in {path.parent} were trained on base {base} "
            f"({describe_fingerprint(recorded)}); {located} now has "
            f"{describe_fingerprint(current)}: another model ({', '.join(differs)} "
            f"{'differs' if len(differs) == 1 else 'differ'}). Put the model they were trained "
            f"on back at {base}, {fix}"
        )
    return str(base)


def older_base(base: str, path: Path) -> str:
    """Return an older record's base (no fingerprint), or refuse an ambiguous relative one.

    Raises:
        SavedModelError: a relative path that exists here, or an absolute one that is gone.

    """
    here = Path(base).expanduser()
    fix = (
        f'edit "base" in {path} to the absolute path (or hub id) of the model the adapters '
        "were trained on"
    )
    if here.is_absolute() and not here.exists():
        raise SavedModelError(f"the base model {base} named in {path} is not there any more; {fix}")
    if not here.is_absolute() and here.exists():
        raise SavedModelError(
            f"{path} (written by an older flowlearn) names its base as typed, {base!r}, relative "
            f"to the folder training ran in and without a fingerprint: from here it would load "
            f"{here.resolve()}, which may be another model; {fix}"
        )
    logger.warning(
        "%s was written by an older flowlearn: its base %s has no fingerprint to check it by. "
        'If it is a folder, edit "base" there to its absolute path',
        path,
        base,
    )
    return base
