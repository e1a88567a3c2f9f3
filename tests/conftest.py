from __future__ import annotations

import sys
from pathlib import Path

# The shared fakes live beside the tests, importable as `fakes` from every test folder.
sys.path.insert(0, str(Path(__file__).parent))
