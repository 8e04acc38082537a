"""The inventory's `notify:` entries: an apprise URL each, the alert kinds it receives and how often one kind
of one run may repeat. Only their shape is checked here; whether apprise knows a URL is checked when a watch
starts (apprise is an optional extra), with the entry's line."""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from ..alertkinds import DEFAULT_KINDS, DEFAULT_REPEAT_S, check_kind


class NotifySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(description="an apprise URL: ntfy://..., slack://..., json://host/path, mailto://...")
    kinds: list[Annotated[str, AfterValidator(check_kind)]] = Field(default_factory=lambda: list(DEFAULT_KINDS))
    repeat_s: float = Field(DEFAULT_REPEAT_S, ge=0, description="at most one notification per kind and run "
                                                                 "in this many seconds")
    _line: int | None = PrivateAttr(None)  # where the entry is in the inventory file, for later errors

    @field_validator("url")
    @classmethod
    def _looks_like_a_url(cls, value: str) -> str:
        scheme, sep, rest = value.strip().partition("://")
        if not sep or not scheme or not rest:
            raise ValueError(f"{value[:80]!r} is not an apprise URL (SERVICE://..., e.g. ntfy://ntfy.sh/TOPIC)")
        return value.strip()

    @property
    def line(self) -> int | None:
        return self._line
