"""Public names a package imports on first use (PEP 562), so importing it stays light.

A package keeps a table of its public names and the module defining each, and its module-level
`__getattr__` and `__dir__` call these: the CLI parses its options, and Studio loads its graph,
before LangGraph, LangChain or torch load.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, MutableMapping
from typing import Any


def lazy_attribute(name: str, table: Mapping[str, str], namespace: MutableMapping[str, Any]) -> Any:
    """Return public name `name` from its module in `table`, kept in `namespace` from then on.

    Raises:
        AttributeError: a name the table does not hold, as a module without it would.

    """
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    namespace[name] = value
    return value


def lazy_dir(table: Mapping[str, str], namespace: Mapping[str, Any]) -> list[str]:
    """Return the module's own names and the public names it loads on first use."""
    return sorted({*namespace, *table})
