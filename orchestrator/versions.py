"""What is installed: dflashctl itself, its agent, and what a target's trainer would run with.

The trainer's torch and transformers are asked of the target's own Python in a child process, by package
metadata: the controller never imports torch, and asking costs milliseconds instead of torch's import time.
"""
from __future__ import annotations

import importlib.metadata
import json
import sys

from dflash_records.protocol import AGENT_VERSION, PROTOCOL_VERSION

from .errors import DflashError
from .inventory.model import Target
from .transports.base import Transport
from .transports.timeouts import PROBE_TIMEOUT_S

DISTRIBUTION = "dflashctl"
TRAINER_PACKAGES = ("torch", "transformers")
# Python 3.8 syntax and the stdlib only: it runs in whatever Python the target names.
PROBE = """\
import json, sys
import importlib.util
try:
    import importlib.metadata as metadata
except ImportError:
    metadata = None
found = {"python": sys.version.split()[0], "executable": sys.executable}
for name in sys.argv[1:]:
    try:
        found[name] = metadata.version(name) if metadata and importlib.util.find_spec(name) else None
    except Exception:
        found[name] = None
print(json.dumps(found))
"""


def package_version() -> str:
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def controller_versions() -> dict:
    return {"dflashctl": package_version(), "agent_version": AGENT_VERSION, "agent_protocol": PROTOCOL_VERSION,
            "python": sys.version.split()[0], "python_executable": sys.executable}


def trainer_versions(transport: Transport, target: Target) -> dict:
    """The target Python's version and its torch/transformers versions (None: not importable there)."""
    try:
        result = transport.run([target.python, "-c", PROBE, *TRAINER_PACKAGES], timeout=PROBE_TIMEOUT_S)
    except DflashError as exc:
        return {"target": target.name, "error": str(exc)}
    try:
        found = json.loads(result.out.strip().splitlines()[-1]) if result.ok else None
    except (ValueError, IndexError):
        found = None
    if not isinstance(found, dict):
        return {"target": target.name, "error": f"{target.python} did not answer: {result.describe()}"}
    return {"target": target.name, **found}


def one_line() -> str:
    v = controller_versions()
    return f"dflashctl {v['dflashctl']} (agent {v['agent_version']}, Python {v['python']})"
