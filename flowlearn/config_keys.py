"""The names of `flowlearn train`'s config keys, read without importing TRL, and their errors.

`flowlearn train --nonsense` must fail in a second, but the keys are `FlowGRPOConfig`'s fields,
most of them TRL's and transformers' (`GRPOConfig`, `TrainingArguments`), and importing those
takes torch with them (7 s on an idle 2-core machine, a minute under load). So the field names
are read from the classes' source with `ast`, following each base class to the module it is
imported from. Anything this cannot follow (a base built by a call, a missing file) gives
None, and the caller leaves the check to TRL's own parser, which makes the same refusal with
the same message (`unknown_keys_message`); a test keeps the two sets equal. It imports
nothing of flowlearn (the bottom layer), so the CLI reads it before anything else loads.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

RENAMED = {
    "group_size": "num_generations",
    "planner_temperature": "temperature",
    "planner_top_p": "top_p",
    "planner_max_new_tokens": "max_completion_length",
    "scale": "scale_rewards",
    "device": "use_cpu",
}
"""Old spellings of settings that are now TRL's, named in the unknown-key error."""

CONFIG_CLASS = ("flowlearn.training.config", "FlowGRPOConfig")
"""Where `flowlearn train`'s config class is defined."""


def unknown_keys_message(options: Sequence[str]) -> str:
    """Say which keys are unknown and, for renamed ones, their name now."""
    names = [option.lstrip("-").split("=")[0].replace("-", "_") for option in options]
    hints = [f"{name} is now {RENAMED[name]}" for name in names if name in RENAMED]
    hints += [f"for {name} use --{name[3:]} false" for name in names if name.startswith("no_")]
    return (
        f"unknown config keys {names}"
        + "".join(f"; {hint}" for hint in hints)
        + "; `flowlearn train --help` lists the known ones"
    )


def unknown_flags(argv: Sequence[str]) -> list[str] | None:
    """Return the `--flags` in `argv` that name no config key; None when the keys are unknown.

    A flag is known as TRL's parser (`HfArgumentParser`) spells it: `--name`, `--name-with-
    dashes`, `--no_name` for a field of default True (here: for any field), `--config` and
    `--help`. A value such as `-1` is not a flag.
    """
    known = config_keys()
    if known is None:
        return None
    spelled = {*known, *(f"no_{name}" for name in known), "config", "help", "h"}
    flags = [a for a in argv if a.startswith("-") and not a.lstrip("-")[:1].isdigit()]
    return [f for f in flags if f.lstrip("-").split("=")[0].replace("-", "_") not in spelled]


@cache
def config_keys() -> frozenset[str] | None:
    """Return the field names of `FlowGRPOConfig` and its bases, read from their source."""
    return class_fields(*CONFIG_CLASS)


def class_fields(module: str, name: str) -> frozenset[str] | None:
    """Return the annotated names of class `name` in `module` and of its bases (None: unknown)."""
    tree = _parse(module)
    if tree is None:
        return None
    imported = _imported_names(tree, module)
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    if not found:  # re-exported, as `from transformers import TrainingArguments`
        return class_fields(*imported[name]) if name in imported else None
    names = {
        statement.target.id
        for statement in found[0].body
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
    }
    for base in found[0].bases:
        if not isinstance(base, ast.Name):
            return None
        if base.id == "object":
            continue
        owner, real = imported.get(base.id, (module, base.id))
        inherited = class_fields(owner, real)
        if inherited is None:
            return None
        names |= inherited
    return frozenset(names)


def _imported_names(tree: ast.Module, module: str) -> dict[str, tuple[str, str]]:
    """Map each name a module imports with `from X import Y` to (X, Y).

    Imports under `if TYPE_CHECKING:` count: lazy packages (transformers) name their
    re-exports there.
    """
    names: dict[str, tuple[str, str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:  # relative to the module's package
                source = _absolute(module, source, node.level)
            for alias in node.names:
                names[alias.asname or alias.name] = (source, alias.name)
    return names


def _absolute(module: str, source: str, level: int) -> str:
    """Resolve `from <level dots><source> import ...` written in `module`."""
    path = module_file(module)
    is_package = path is not None and path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{source}" if source else package


@cache
def _parse(module: str) -> ast.Module | None:
    path = module_file(module)
    if path is None:
        return None
    try:
        return ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


def module_file(module: str) -> Path | None:
    """Find a module's source file without importing it (nor, past its top, its packages).

    flowlearn's own subpackages are found through the import system (an editable install maps
    them to other folders); the parent `flowlearn` is light to import.
    """
    parts = module.split(".")
    head = 2 if parts[0] == "flowlearn" and len(parts) > 1 else 1
    try:
        spec = importlib.util.find_spec(".".join(parts[:head]))
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if len(parts) == head:
        return Path(spec.origin) if spec.origin else None
    places: Iterable[str] = spec.submodule_search_locations or ()
    for part in parts[head:-1]:
        places = [str(Path(place) / part) for place in places]
    for place in places:
        for candidate in (Path(place) / f"{parts[-1]}.py", Path(place) / parts[-1] / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None
