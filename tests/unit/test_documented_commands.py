"""Every `flowlearn` command the README and docs show parses: `train` into a valid config,
`run`, `eval`, `collect` and `serve` by the command line's own parser.

A recipe a user copies must not be refused by the trainer's own checks (a 7B command whose
rounds its passes did not cover was). `--config train.yaml` stands for a user's own file
(`USERS_CONFIG`). Parsing loads no model.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from flowlearn.cli import build_parser
from flowlearn.training.config import parse_config

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "sh", "")
USERS_CONFIG = "planner: Qwen/Qwen2.5-1.5B-Instruct\nbenchmark: gameof24\n"
"""What `--config train.yaml` stands for: a user's config naming a hub planner and a task, as
the pages that serve the planner on vLLM have it."""


def commands(page: Path, subcommand: str) -> list[str]:
    """The arguments of each `flowlearn SUBCOMMAND` line in the page's shell blocks."""
    commands: list[str] = []
    language: str | None = None
    block: list[str] = []
    for line in page.read_text().splitlines():
        if not line.startswith("```"):
            if language is not None:
                block.append(line)
            continue
        if language is None:
            language, block = line[3:].strip(), []
            continue
        if language in SHELL:
            for command in "\n".join(block).replace("\\\n", " ").splitlines():
                found = re.search(rf"(?:^|\s)(?:-m )?flowlearn {subcommand}\b(.*)", command)
                if found:
                    commands.append(found.group(1).split(" #")[0])
        language = None
    return commands


COMMANDS = [
    pytest.param(arguments, id=f"{page.name}:{index}")
    for page in PAGES
    for index, arguments in enumerate(commands(page, "train"))
]
OTHERS = [
    pytest.param(subcommand, arguments, id=f"{page.name}:{subcommand}:{index}")
    for page in PAGES
    for subcommand in ("run", "eval", "collect", "serve")
    for index, arguments in enumerate(commands(page, subcommand))
]


def test_the_pages_show_commands() -> None:
    assert len(COMMANDS) >= 8, [c.values for c in COMMANDS]
    assert len(OTHERS) >= 10, [c.values for c in OTHERS]


@pytest.mark.parametrize(("subcommand", "arguments"), OTHERS)
def test_documented_command_parses(subcommand: str, arguments: str) -> None:
    build_parser().parse_args([subcommand, *shlex.split(arguments)])


@pytest.mark.parametrize("arguments", COMMANDS)
def test_documented_train_command_parses(
    arguments: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    users = tmp_path / "train.yaml"
    users.write_text(USERS_CONFIG)
    argv = [str(users) if a == "train.yaml" else a for a in shlex.split(arguments)]
    config = parse_config(argv)
    rollouts = config.questions_per_step * config.num_generations
    assert config.per_device_train_batch_size * config.steps_per_generation == rollouts


def test_the_readme_stays_about_600_lines_of_user_documentation() -> None:
    """The README is the user's first page; reference material goes to docs/ (a page each)."""
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= 610, f"README.md has {lines} lines; move reference material to docs/"
