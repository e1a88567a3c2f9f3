"""The house rules that keep the tree readable, checked: sizes, one-way imports, one record."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PACKAGE_DIRS = ("flowlearn", "engine", "graphs", "nodes", "training", "evals", "bench", "research")
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 100


def sources(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def test_no_module_over_600_lines_and_no_function_over_100() -> None:
    too_long = []
    for path in sources(*PACKAGE_DIRS):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(ROOT)
        if len(text.splitlines()) > MAX_FILE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long, "\n".join(too_long)


def test_only_the_composition_root_reads_flowlearn_variables() -> None:
    readers = []
    for path in sources("engine", "graphs", "nodes", "training", "evals", "flowlearn"):
        if path.name == "names.py" and path.parent.name == "compose":
            continue
        text = path.read_text(encoding="utf-8")
        names = set(re.findall(r"^(\w+)\s*=\s*[\"']FLOWLEARN_", text, flags=re.M))
        for line_no, line in enumerate(text.splitlines(), 1):
            if not re.search(r"\b(environ|getenv)\b", line):
                continue
            if "FLOWLEARN_" in line or any(re.search(rf"\b{n}\b", line) for n in names):
                readers.append(f"{path.relative_to(ROOT)}:{line_no}: {line.strip()}")
    assert not readers, "\n".join(readers)


def test_bench_imports_only_flowlearn() -> None:
    offenders = []
    for path in sources("bench", "research"):
        text = path.read_text(encoding="utf-8")
        if "tests" in re.findall(r"sys\.path\.insert\(.*?\"(\w+)\"", text) or re.search(
            r"parents\[\d\]\s*/\s*\"tests\"", text
        ):
            offenders.append(str(path.relative_to(ROOT)))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and (
                node.module in {"fakes", "tiny_model"} or (node.module or "").startswith("tests")
            ):
                offenders.append(f"{path.relative_to(ROOT)} imports {node.module}")
    assert not offenders, offenders


def test_the_transition_record_is_one_object() -> None:
    from flowlearn import graphs, nodes, training

    assert nodes.Transition is training.Transition is graphs.Transition


@pytest.mark.parametrize("layer", ["engine", "graphs", "nodes", "training", "evals"])
def test_no_type_checking_imports_of_project_modules(layer: str) -> None:
    dodges = []
    for path in sources(layer):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if path.name == "__init__.py" and any(
            isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body
        ):
            continue  # names loaded on first use (PEP 562), declared for mypy: test_lazy_names
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith(
                        "flowlearn"
                    ):
                        dodges.append(f"{path.relative_to(ROOT)}:{inner.lineno}")
    assert not dodges, dodges
