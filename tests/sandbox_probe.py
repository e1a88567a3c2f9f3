"""Whether this host can run the `python` tool's sandbox, and a mark that skips where not."""

from __future__ import annotations

import pytest

from flowlearn.nodes.tools.sandbox import find_bwrap, probe

WHY_NOT = probe(find_bwrap())
sandboxed = pytest.mark.skipif(WHY_NOT is not None, reason=f"no sandbox here: {WHY_NOT}")
