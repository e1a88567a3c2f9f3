"""Each prompt set renders every role's template with its fields; bad sets are refused."""

from __future__ import annotations

import dataclasses
import re

import pytest

from flowlearn.nodes import prompts
from flowlearn.nodes.prompts import AGENTFLOW_PROMPTS, FIELDS, Prompts
from flowlearn.nodes.smollm2 import SMOLLM2_PROMPTS

SETS = {"agentflow": AGENTFLOW_PROMPTS, "smollm2": SMOLLM2_PROMPTS}


@pytest.mark.parametrize("role", sorted(FIELDS))
@pytest.mark.parametrize("name", sorted(SETS))
def test_each_template_renders_its_declared_fields_without_leftover_braces(
    name: str, role: str
) -> None:
    template = getattr(SETS[name], role)
    rendered = template.format(**{f: f"<{f}>" for f in FIELDS[role]})
    assert not re.search(r"[{}]", rendered), f"{name}.{role} left braces: {rendered}"


@pytest.mark.parametrize("name", sorted(SETS))
@pytest.mark.parametrize("role", ["planner", "verifier", "generator"])
def test_without_an_analysis_no_analysis_field_is_left(name: str, role: str) -> None:
    template = SETS[name].template(role, analysis=False)
    assert "{analysis}" not in template
    rendered = template.format(**{f: f"<{f}>" for f in FIELDS[role]})
    assert not re.search(r"[{}]", rendered)


def test_agentflow_planner_asks_for_the_papers_fields_in_order() -> None:
    text = AGENTFLOW_PROMPTS.planner
    order = [text.index(f"**{name}:**") for name in ("Justification", "Context", "Sub-Goal")]
    order.append(text.index("**Tool Name:**"))
    assert order == sorted(order)
    assert AGENTFLOW_PROMPTS.analyze and AGENTFLOW_PROMPTS.planner_reply_prefix is None
    assert not AGENTFLOW_PROMPTS.generator_examples and not AGENTFLOW_PROMPTS.verdict_choices


def test_module_level_templates_all_belong_to_a_role() -> None:
    constants = {n for n, v in vars(prompts).items() if n.isupper() and isinstance(v, str)}
    assert {"PLANNER_PROMPT", "VERIFIER_PROMPT", "GENERATOR_PROMPT"} <= constants


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"planner": "Plan {question} with {tool}"}, r"planner prompt uses fields \['tool'\]"),
        ({"generator": "Answer {question"}, "not a valid str.format template"),
        ({"verifier": 3}, "verifier prompt must be a string"),
        ({"search_k": 0}, "search_k must be >= 1"),
    ],
)
def test_a_bad_prompt_set_is_refused_with_what_to_fix(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(AGENTFLOW_PROMPTS, **change)


def test_a_template_without_its_analysis_section_still_renders_without_one() -> None:
    custom = Prompts(planner="Q: {question}\nA: {analysis}\n{tools}{examples}")
    assert custom.planner_analysis == ""  # nothing to cut: the field renders empty
    assert "{analysis}" in custom.template("planner", analysis=False)


def test_budgets_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="budget generator must be a whole number"):
        prompts.Budgets(generator=0)
