"""Allow `python -m flowlearn`."""

from flowlearn.cli import main

raise SystemExit(main())
