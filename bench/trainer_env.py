"""The environment the benchmarks run `python -m trainer` in: this checkout first on PYTHONPATH, the caller's
entries after it (packages installed beside the system's may live there), no hub traffic, quiet tokenizers."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def trainer_env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", **extra}
