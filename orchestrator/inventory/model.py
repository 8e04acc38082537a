"""The inventory: which hosts and containers exist and how to reach them; which file a command reads it from.

Loaded from YAML and validated by pydantic (schema.py, whose errors name the file, the line and the field);
a target's host, container and defaults are resolved here.
"""
from __future__ import annotations

import difflib
import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dflash_records.protocol import ascii_decimal
from dflash_records.restart import NEVER

from ..errors import InventoryError, TargetNotFound, shorten
from .schema import HostSpec, InventoryModel, validate_inventory
from .yaml_lines import MAX_BYTES, load_located

LOCAL = "local"


@dataclass(frozen=True)
class HostConfig:
    """One host with the defaults filled in."""

    name: str
    transport: Literal["ssh", "local"]
    address: str | None
    port: int | None  # None: let ~/.ssh/config decide, else 22
    user: str | None  # None: ~/.ssh/config's User for this host, else `fallback_user`
    identity_file: str | None
    known_hosts: str | None
    host_key_policy: Literal["reject", "accept-new"]
    connect_timeout: float
    pct: str
    fallback_user: str = "root"


@dataclass(frozen=True)
class Target:
    """Where a run lives: `HOST/CTID`, `HOST` (no container) or `local`."""

    host: HostConfig
    ctid: int | None
    workdir: str
    python: str
    gpus: int
    restart: str = NEVER  # the inventory's restart policy for a launch that names none
    queue: bool = False   # the inventory's `queue:`: a launch without --queue/--no-queue waits for held GPUs

    @property
    def name(self) -> str:
        return self.host.name if self.ctid is None else f"{self.host.name}/{self.ctid}"


@dataclass(frozen=True)
class Inventory:
    path: Path | None
    model: InventoryModel

    def host(self, name: str) -> HostConfig:
        spec = self.model.hosts.get(name)
        if spec is None:
            known = ", ".join(self.model.hosts) or "none"
            raise TargetNotFound(f"unknown host {shorten(name)!r}{_close(name, self.model.hosts)}; hosts in "
                                 f"{self._where()}: {known}")
        d = self.model.defaults
        return HostConfig(
            name=name,
            transport=spec.transport,
            address=spec.address,
            port=spec.port if spec.port is not None else (d.port if "port" in d.model_fields_set else None),
            # an explicit user wins; otherwise ~/.ssh/config may name one, and the defaults' user comes last
            user=spec.user if spec.user is not None else (d.user if "user" in d.model_fields_set else None),
            identity_file=_expand(spec.identity_file),
            known_hosts=_expand(spec.known_hosts),
            host_key_policy=spec.host_key_policy or d.host_key_policy,
            connect_timeout=spec.connect_timeout or d.connect_timeout,
            pct=spec.pct or d.pct,
            fallback_user=d.user,
        )

    def target(self, text: str) -> Target:
        """Resolve `HOST/CTID`, `HOST` or `local`."""
        host_name, _, ctid_text = text.partition("/")
        host = self.host(host_name)
        spec = self.model.hosts[host_name]
        d = self.model.defaults
        if not ctid_text:
            if spec.containers:
                ids = ", ".join(f"{host_name}/{c}" for c in spec.containers)
                raise TargetNotFound(f"{host_name} has containers; name one: {ids}")
            workdir = spec.workdir or (_local_workdir() if host.transport == "local" else d.workdir)
            return Target(host=host, ctid=None, workdir=workdir, python=spec.python or d.python, gpus=spec.gpus,
                          restart=spec.restart or d.restart, queue=_first(spec.queue, d.queue))
        ctid = ascii_decimal(ctid_text)
        if ctid is None:
            raise TargetNotFound(f"bad target {shorten(text)!r}: the container id after '/' must be a number "
                                 f"(digits 0-9)")
        container = spec.containers.get(ctid)
        if container is None:
            known = ", ".join(str(c) for c in spec.containers) or "none"
            raise TargetNotFound(f"{host_name} has no container {ctid}{_close(text, spec.containers, host_name)}; "
                                 f"its containers in {self._where()}: {known}")
        return Target(
            host=host,
            ctid=ctid,
            workdir=container.workdir or spec.workdir or d.workdir,
            python=container.python or spec.python or d.python,
            gpus=container.gpus,
            restart=container.restart or spec.restart or d.restart,
            queue=_first(container.queue, spec.queue, d.queue),
        )

    def all_targets(self) -> list[Target]:
        out: list[Target] = []
        for name, spec in self.model.hosts.items():
            if spec.containers:
                out.extend(self.target(f"{name}/{ctid}") for ctid in spec.containers)
            else:
                out.append(self.target(name))
        return out

    def targets(self, names: list[str] | None) -> list[Target]:
        """The named targets, or every target of the inventory; duplicates dropped, order kept."""
        found = [self.target(n) for n in names] if names else self.all_targets()
        unique: dict[str, Target] = {}
        for t in found:
            unique.setdefault(t.name, t)
        return list(unique.values())

    def matching(self, pattern: str) -> list[Target]:
        """The targets whose name or whose host's name matches the glob `pattern`, in the inventory's order:
        `pve*` is every target of the hosts pve1, pve2, ...; `pve1/*` the containers of pve1; `pve1/2??` some of
        them (case counts, as in a TARGET)."""
        found = [t for t in self.all_targets()
                 if fnmatch.fnmatchcase(t.name, pattern) or fnmatch.fnmatchcase(t.host.name, pattern)]
        if not found:
            known = ", ".join(t.name for t in self.all_targets())
            raise TargetNotFound(f"no target matches {shorten(pattern, 60)!r}; targets in {self._where()}: "
                                 f"{shorten(known)}")
        return found

    def _where(self) -> str:
        return str(self.path) if self.path else "the built-in inventory"


def _close(typed: str, names, host: str | None = None) -> str:
    """` (did you mean 'local'?)` where a host (or a container of `host`) is close to what was typed."""
    close = difflib.get_close_matches(typed, [f"{host}/{n}" if host else n for n in names], n=2)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def _first(*values: bool | None) -> bool:
    """The most specific of a container's, its host's and the defaults' flag that is set (`queue: false` on a
    container wins over `queue: true` in the defaults)."""
    return next((value for value in values if value is not None), False)


def _expand(path: str | None) -> str | None:
    return os.path.expanduser(path) if path else None


def _local_workdir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "dflashctl")


def builtin_inventory() -> Inventory:
    """What a machine with no inventory file has: just this machine."""
    return Inventory(path=None, model=InventoryModel(hosts={LOCAL: HostSpec(transport="local")}))


@dataclass(frozen=True)
class InventoryChoice:
    """Which inventory file a command uses, and why."""

    path: Path | None
    source: str                   # "--inventory", "./inventory.yaml", "$DFLASHCTL_INVENTORY" or "built-in"
    shadowed: Path | None = None  # $DFLASHCTL_INVENTORY, when a different ./inventory.yaml beat it

    def describe(self) -> str:
        return f"{self.path} ({self.source})" if self.path else "the built-in one (this machine as `local`)"


def choose_inventory(explicit: str | None, *, cwd: Path | None = None) -> InventoryChoice:
    """--inventory, else ./inventory.yaml, else $DFLASHCTL_INVENTORY, else None (built-in)."""
    if explicit:
        return InventoryChoice(Path(explicit), "--inventory")
    here = (cwd or Path.cwd()) / "inventory.yaml"
    env = os.environ.get("DFLASHCTL_INVENTORY")
    if here.is_file():
        other = Path(env) if env and not _same_file(here, Path(env)) else None
        return InventoryChoice(here, "./inventory.yaml", shadowed=other)
    if env:
        return InventoryChoice(Path(env), "$DFLASHCTL_INVENTORY")
    return InventoryChoice(None, "built-in")


def find_inventory(explicit: str | None, *, cwd: Path | None = None) -> Path | None:
    return choose_inventory(explicit, cwd=cwd).path


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:  # $DFLASHCTL_INVENTORY names nothing there: not the same file
        return False


def load_inventory(path: Path | None) -> Inventory:
    if path is None:
        return builtin_inventory()
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)  # never all of a huge file (or of /dev/zero)
    except OSError as exc:
        raise InventoryError(f"{path}: cannot read the inventory: {exc.strerror or exc}") from exc
    if len(raw) > MAX_BYTES:
        raise InventoryError(f"{path}: the inventory is larger than the limit of 1 MiB ({MAX_BYTES} bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InventoryError(f"{path}: the inventory is not UTF-8 text") from exc
    return parse_inventory(text, path)


def parse_inventory(text: str, path: Path) -> Inventory:
    model = validate_inventory(load_located(text, str(path)), path)
    inv = Inventory(path=path, model=model)
    if LOCAL not in model.hosts:
        model.hosts[LOCAL] = HostSpec(transport="local")
    return inv
