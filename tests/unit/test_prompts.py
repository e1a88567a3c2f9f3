from __future__ import annotations

import re
import string

import pytest

from flowlearn.nodes import prompts

TEMPLATES = {
    name: value
    for name, value in vars(prompts).items()
    if name.isupper() and isinstance(value, str)
}


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_template_renders_without_leftover_braces(name: str) -> None:
    template = TEMPLATES[name]
    fields = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    rendered = template.format(**{f: f"<{f}>" for f in fields})
    assert not re.search(r"[{}]", rendered), f"{name} left braces: {rendered}"
    for f in fields:
        assert f"<{f}>" in rendered
