"""Pack what is shipped to targets into deterministic archives: the agent (dflash_agent/) as one zipapp
(`python3 agent.pyz <subcommand> ...`), source trees (the trainer) as a tar.gz.

The zipapp holds that package as `dflash_agent/` (its modules import each other relatively), the records it
shares with the trainer and the controller as `dflash_records/` (imported absolutely: the zipapp's root is on
sys.path) and a root `__main__.py` that calls its cli. The trainer's tar holds `dflash_records/` beside
`trainer/` for the same reason. In both, fixed timestamps, modes and owners and sorted names make the bytes,
and so the digest, change only with the code: not with the time of the build, the checkout's umask or mtimes.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import zipfile
from pathlib import Path

import dflash_agent
import dflash_records

AGENT_DIR = os.path.dirname(os.path.abspath(dflash_agent.__file__))
ARCHIVE_PACKAGE = "dflash_agent"
RECORDS_DIR = Path(dflash_records.__file__).resolve().parent
RECORDS_PACKAGE = "dflash_records"
FIXED_DATE = (1980, 1, 1, 0, 0, 0)
SHEBANG = b"#!/usr/bin/env python3\n"
MAIN = ("# dflashctl agent zipapp entry point\n"
        "import sys\n"
        "from {}.cli import main\n"
        "sys.exit(main())\n").format(ARCHIVE_PACKAGE)


def _package_files(directory) -> list:
    return sorted(name for name in os.listdir(directory) if name.endswith(".py"))


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
        for directory, package in ((AGENT_DIR, ARCHIVE_PACKAGE), (RECORDS_DIR, RECORDS_PACKAGE)):
            for name in _package_files(directory):
                with open(os.path.join(directory, name), "rb") as handle:
                    _add(archive, "{}/{}".format(package, name), handle.read())
    return SHEBANG + buffer.getvalue()


SHIPPED_SUFFIXES = (".py", ".yaml", ".json", ".txt")


def build_tarball(trees: dict[str, Path]) -> tuple[bytes, bytes]:
    """(tar, its gzip) of the source files under each tree's root (SHIPPED_SUFFIXES, no __pycache__), named
    `top/...` by its key. Each member is a plain rw-r--r-- file, mtime 0; gzip's header, which holds a time, says
    0 too."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        shipped = {f"{top}/{path.relative_to(root).as_posix()}": path for top, root in trees.items()
                   for path in root.rglob("*") if _shipped(path, root)}
        for name in sorted(shipped):
            data = shipped[name].read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    tar = buffer.getvalue()
    return tar, gzip.compress(tar, compresslevel=6, mtime=0)


def _shipped(path: Path, root: Path) -> bool:
    return (path.suffix in SHIPPED_SUFFIXES and path.is_file()
            and "__pycache__" not in path.relative_to(root).parts)


def bundle_digest(data: bytes) -> str:
    """Short content hash, used to name the deployed file so a new version never overwrites a running one."""
    return hashlib.sha256(data).hexdigest()[:16]

