"""The in-container agent: stdlib only, runs on any Python >= 3.8 inside a container.

It is shipped as one zipapp (built by orchestrator/runs/bundle.py) and run as `python3 agent.pyz <subcommand>
...`; cli.py is its only entry point. Every request prints exactly one JSON object on stdout. Modules here import
only the standard library and each other; protocol.py holds what the controller shares with them (run states,
names, codes, the GPU query and its thresholds, sizes, versions), terminaltext.py what a terminal shows of a
log line, gpus.py the parser of nvidia-smi's rows.
"""
from __future__ import annotations
