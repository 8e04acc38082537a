"""What an inventory file may say: its pydantic schema, and what is wrong with one that says otherwise.

Every error names the file, the line and the field, because a person fixes it in an editor; a traceback would
only tell them where our code was. One line per real mistake: unknown keys (with the key meant, where one is
close) and bad values first, the knock-on errors of a mistake left out.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from dflash_records.protocol import ascii_decimal
from dflash_records.restart import NEVER, parse_policy

from ..errors import InventoryError
from .notify import NotifySpec
from .yaml_lines import LocatedYaml


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
    queue: bool = Field(False, description="a launch without --queue/--no-queue waits in the container's queue "
                                           "for GPUs that are held, instead of being refused")

    _check_restart = field_validator("restart")(_restart_policy)


class ContainerSpec(_Strict):
    gpus: int = Field(0, ge=0, description="how many GPUs the container sees")
    workdir: str | None = None
    python: str | None = None
    restart: str | None = None
    queue: bool | None = None

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
    queue: bool | None = None
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


def validate_inventory(located: LocatedYaml, path: Path) -> InventoryModel:
    """The model of a loaded inventory file; an InventoryError says every mistake, each at its line."""
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
    return model


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
