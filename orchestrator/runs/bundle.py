"""Pack the agent (orchestrator/agent/) into one deterministic zipapp (`python3 agent.pyz <subcommand> ...`).

The archive holds that package as `dflash_agent/` (its modules import each other relatively) and a root
`__main__.py` that calls its cli. Fixed timestamps and modes make the bytes, and so the digest, change only
with the code.
"""
from __future__ import annotations

import hashlib
import io
import os
import zipfile

from .. import agent

AGENT_DIR = os.path.dirname(os.path.abspath(agent.__file__))
ARCHIVE_PACKAGE = "dflash_agent"
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
SHEBANG = b"#!/usr/bin/env python3\n"
MAIN = ("# dflashctl agent zipapp entry point\n"
        "import sys\n"
        "from {}.cli import main\n"
        "sys.exit(main())\n").format(ARCHIVE_PACKAGE)


def _package_files() -> list:
    return sorted(name for name in os.listdir(AGENT_DIR) if name.endswith(".py"))


def _add(archive: zipfile.ZipFile, name: str, data: bytes) -> None:
    info = zipfile.ZipInfo(name, date_time=FIXED_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    info.create_system = 3  # unix, whatever the building OS is
    archive.writestr(info, data)


def build_zipapp() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        _add(archive, "__main__.py", MAIN.encode())
        for name in _package_files():
            with open(os.path.join(AGENT_DIR, name), "rb") as handle:
                _add(archive, "{}/{}".format(ARCHIVE_PACKAGE, name), handle.read())
    return SHEBANG + buffer.getvalue()


def bundle_digest(data: bytes) -> str:
    """Short content hash, used to name the deployed file so a new version never overwrites a running one."""
    return hashlib.sha256(data).hexdigest()[:16]


def write_zipapp(path: str) -> str:
    """Write the zipapp to `path` (executable) and return its digest."""
    data = build_zipapp()
    with open(path, "wb") as handle:
        handle.write(data)
    os.chmod(path, 0o755)
    return bundle_digest(data)
