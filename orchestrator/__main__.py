"""`python -m orchestrator ...` is `dflashctl ...` (for an environment without the console script on PATH)."""
from orchestrator.cli import main

raise SystemExit(main())
