"""The inventory: which hosts and containers exist and how to reach them.

Loaded from YAML and validated by pydantic. Every error names the file, the line and the field, because a
person fixes it in an editor; a traceback would only tell them where our code was.
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from ..agent.protocol import ascii_decimal
from ..agent.restart import NEVER, parse_policy
from ..errors import InventoryError, TargetNotFound, shorten
from .notify import NotifySpec
from .yaml_lines import MAX_BYTES, LocatedYaml, load_located

LOCAL = "local"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _restart_policy(value: str | None) -> str | None:
    """`restart:` of the defaults, a host or a container: what `launch --restart` takes."""
    if value is not None:
        parse_policy(value)  # its ValueError names the policy and what is allowed
    return value


class Defaults(_Strict):
    user: str = "root"
    port: int = Field(22, ge=1, le=65535)
    workdir: str = "/workspace"
    python: str = "python3"
    pct: str = "pct"
    connect_timeout: float = Field(10.0, gt=0)
    host_key_policy: Literal["reject", "accept-new"] = "reject"
    restart: str = Field(NEVER, description="restart policy of a launch without --restart: never|on-failure[:N]")

    _check_restart = field_validator("restart")(_restart_policy)


class ContainerSpec(_Strict):
    gpus: int = Field(0, ge=0, description="how many GPUs the container sees")
    workdir: str | None = None
    python: str | None = None
    restart: str | None = None

    _check_restart = field_validator("restart")(_restart_policy)


class HostSpec(_Strict):
    # transport first: the validators of later fields read it
    transport: Literal["ssh", "local"] = "ssh"
    address: str | None = Field(None, validate_default=True)
    port: int | None = Field(None, ge=1, le=65535)
    user: str | None = None
    identity_file: str | None = None
    known_hosts: str | None = None
    host_key_policy: Literal["reject", "accept-new"] | None = None
    connect_timeout: float | None = Field(None, gt=0)
    pct: str | None = None
    workdir: str | None = None
    python: str | None = None
    gpus: int = Field(0, ge=0, description="GPUs of the host itself, when used without containers")
    restart: str | None = None
    containers: dict[int, ContainerSpec] = Field(default_factory=dict)

    @field_validator("address")
    @classmethod
    def _address_for_ssh(cls, value: str | None, info: ValidationInfo) -> str | None:
        transport = info.data.get("transport", "ssh")
        if transport == "ssh" and not value:
            raise ValueError("an SSH host needs an address (an IP, a DNS name or an ~/.ssh/config alias)")
        if value and (value.startswith("-") or any(c.isspace() or not c.isprintable() for c in value)):
            # ssh and ssh-keyscan would read a leading '-' as an option
            raise ValueError(f"address {value[:80]!r} must not start with '-' or hold spaces")
        if transport == "local" and value:
            raise ValueError("a local host has no address")
        return value

    _check_restart = field_validator("restart")(_restart_policy)

    @field_validator("containers")
    @classmethod
    def _no_containers_on_local(cls, value: dict, info: ValidationInfo) -> dict:
        if info.data.get("transport") == "local" and value:
            raise ValueError("a local host has no containers (it runs on this machine, without pct)")
        return value


class InventoryModel(_Strict):
    defaults: Defaults = Field(default_factory=Defaults)
    hosts: dict[str, HostSpec] = Field(default_factory=dict)
    notify: list[NotifySpec] = Field(default_factory=list)

    @field_validator("notify", mode="before")
    @classmethod
    def _no_notify_is_none(cls, value: object) -> object:
        return [] if value is None else value  # `notify:` with every entry commented out

    @field_validator("hosts")
    @classmethod
    def _host_names(cls, value: dict[str, HostSpec]) -> dict[str, HostSpec]:
        for name in value:
            if not name or "/" in name or name.startswith("-") or any(c.isspace() for c in name):
                raise ValueError(f"host name {name!r} must be non-empty, without '/', spaces or a leading '-'")
        return value


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
                          restart=spec.restart or d.restart)
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

    def _where(self) -> str:
        return str(self.path) if self.path else "the built-in inventory"


def _close(typed: str, names, host: str | None = None) -> str:
    """` (did you mean 'local'?)` where a host (or a container of `host`) is close to what was typed."""
    close = difflib.get_close_matches(typed, [f"{host}/{n}" if host else n for n in names], n=2)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


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
    located = load_located(text, str(path))
    data = located.data if located.data is not None else {}
    if not isinstance(data, dict):
        raise InventoryError(f"{path}:1: the inventory must be a mapping with `hosts:` (and optional `defaults:`,"
                             " `notify:`)")
    _check_container_ids(data, located, path)
    try:
        model = InventoryModel.model_validate(data)
    except ValidationError as exc:
        raise InventoryError(_describe_validation(exc, located, path)) from None
    for index, spec in enumerate(model.notify):
        spec._line = located.line_of(("notify", index, "url"))
    inv = Inventory(path=path, model=model)
    if LOCAL not in model.hosts:
        model.hosts[LOCAL] = HostSpec(transport="local")
    return inv


def _check_container_ids(data: dict, located: LocatedYaml, path: Path) -> None:
    """CTIDs are integers (duplicates, `200` beside `"200"` too, were refused while loading the YAML)."""
    hosts = data.get("hosts")
    if not isinstance(hosts, dict):
        return
    for host_name, spec in hosts.items():
        containers = spec.get("containers") if isinstance(spec, dict) else None
        if not isinstance(containers, dict):
            continue
        converted: dict[int, Any] = {}
        for key, value in containers.items():
            where = located.line_of(("hosts", host_name, "containers", key))
            field = f"hosts.{host_name}.containers.{key}"
            ctid = key if isinstance(key, int) and not isinstance(key, bool) else ascii_decimal(key)
            if ctid is None:
                raise InventoryError(f"{path}:{where}: {field}: a container id must be an integer CTID (digits 0-9), "
                                     f"got {key!r}")
            converted[ctid] = value
        spec["containers"] = converted


def _describe_validation(exc: ValidationError, located: LocatedYaml, path: Path) -> str:
    """One line per real mistake: unknown keys and bad values first, knock-on errors left out."""
    errors = [err for err in exc.errors() if not _knock_on(err, exc.errors())]
    errors.sort(key=lambda err: (err["type"] != "extra_forbidden", located.line_of(tuple(err["loc"])) or 0))
    lines = []
    for err in errors:
        loc = tuple(err["loc"])
        line = located.line_of(loc)
        field = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key {loc[-1]!r}" + _suggest(loc, located)
        elif err["type"] == "missing":
            msg = "required field is missing"
        lines.append(f"{path}:{line}: {field}: {msg}")
    return "\n".join(lines)


def _knock_on(err: dict, errors: list[dict]) -> bool:
    """A host's address/containers check that only failed because of another error of the same host: its
    `transport` was invalid (so it read as ssh), or its address was misspelt (`adress`)."""
    loc = tuple(err["loc"])
    if len(loc) != 3 or loc[0] != "hosts" or loc[2] not in ("address", "containers") or err["type"] != "value_error":
        return False
    host = loc[:2]
    for other in errors:
        other_loc = tuple(other["loc"])
        if other_loc[:2] != host or len(other_loc) != 3:
            continue
        if other_loc[2] == "transport":
            return True
        if other["type"] == "extra_forbidden" and loc[2] == "address" and \
                difflib.get_close_matches(str(other_loc[2]), ["address"], n=1):
            return True
    return False


def _suggest(loc: tuple, located: LocatedYaml) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _model_at(loc: tuple) -> type[BaseModel] | None:
    """Which model validates the mapping at `loc` (to suggest a key for a typo)."""
    if not loc:
        return InventoryModel
    if loc == ("defaults",):
        return Defaults
    if len(loc) == 2 and loc[0] == "hosts":
        return HostSpec
    if len(loc) == 4 and loc[0] == "hosts" and loc[2] == "containers":
        return ContainerSpec
    if len(loc) == 2 and loc[0] == "notify":
        return NotifySpec
    return None
