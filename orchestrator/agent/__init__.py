"""The in-container agent: stdlib only, runs on any Python >= 3.8 inside a container.

It is shipped as one zipapp (see bundle.py) and run as `python3 agent.pyz <subcommand> ...`. Every subcommand
prints exactly one JSON object on stdout. Modules here import only the standard library and each other;
protocol.py holds what the controller shares with them (states, names, codes, versions).
"""
from __future__ import annotations
