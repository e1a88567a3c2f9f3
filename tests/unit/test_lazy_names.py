"""The packages' names load on first use (PEP 562) and are the defining modules' own objects.

`flowlearn.engine`, `.nodes`, `.evals` and `.graphs` import nothing when imported, so the CLI's
options (built from the schema, prompt sets, benchmarks and scorers) parse before LangGraph or
LangChain load; every name they listed before is still importable from the same place.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGES = ["flowlearn.engine", "flowlearn.nodes", "flowlearn.evals", "flowlearn.graphs"]


@pytest.mark.parametrize("name", PACKAGES)
def test_every_public_name_resolves_to_its_modules_object(name: str) -> None:
    package = importlib.import_module(name)
    lazy: dict[str, str] = package._LAZY
    assert set(lazy) <= set(package.__all__)
    for public in package.__all__:
        value = getattr(package, public)
        if public in lazy:
            assert value is getattr(importlib.import_module(lazy[public]), public), public
        assert public in dir(package)
    with pytest.raises(AttributeError, match=f"module '{name}' has no attribute 'Nope'"):
        _ = package.Nope


@pytest.mark.parametrize("name", PACKAGES)
def test_the_type_checking_block_declares_exactly_the_lazy_names(name: str) -> None:
    # the one place a project import sits under TYPE_CHECKING (test_layout lets it): there it
    # tells mypy what `__getattr__` returns, and nothing else may hide in it
    package = importlib.import_module(name)
    tree = ast.parse(Path(str(package.__file__)).read_text(encoding="utf-8"))
    declared = {
        (alias.asname or alias.name, node.module)
        for block in tree.body
        if isinstance(block, ast.If) and ast.unparse(block.test) == "TYPE_CHECKING"
        for node in ast.walk(block)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert declared == set(package._LAZY.items())


def test_from_imports_of_names_and_submodules_keep_working() -> None:
    from flowlearn.engine import BatchingPolicy, kv_cache
    from flowlearn.engine.batching import BatchingPolicy as Deep
    from flowlearn.evals import BENCHMARKS, tool_task
    from flowlearn.graphs import Context, build_agentflow
    from flowlearn.nodes import Context as NodesContext
    from flowlearn.nodes import planner as planner_module
    from flowlearn.nodes.schema.context import Context as SchemaContext

    assert BatchingPolicy is Deep and kv_cache.__name__ == "flowlearn.engine.kv_cache"
    assert "gameof24" in BENCHMARKS and tool_task.__name__ == "flowlearn.evals.tool_task"
    assert Context is NodesContext is SchemaContext and callable(build_agentflow)
    assert planner_module.__name__ == "flowlearn.nodes.planner"


def test_the_schema_and_the_cli_tables_load_without_langgraph() -> None:
    code = (
        "import sys\n"
        "from flowlearn.nodes.schema import Context, Sampling, State\n"
        "from flowlearn.nodes.presets import PROMPT_SETS\n"
        "from flowlearn.evals import BENCHMARKS, SCORERS\n"
        "print(','.join(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'langgraph', 'langchain_core', 'torch', 'transformers', 'trl'})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""
