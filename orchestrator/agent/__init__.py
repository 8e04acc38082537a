"""The in-container agent: stdlib only, runs on any Python >= 3.8 inside a container.

It is shipped as one zipapp (see bundle.py) and run as `python3 agent.pyz <subcommand> ...`. Every subcommand
prints exactly one JSON object on stdout. Modules here import only the standard library and each other.
"""
from __future__ import annotations

AGENT_VERSION = "0.1.0"
PROTOCOL_VERSION = 1
