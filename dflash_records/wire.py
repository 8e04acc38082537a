"""How a typed answer of the agent becomes the JSON object the wire carries, and back: one codec for them all.

A field's JSON is its value, except where its metadata names a record type: `of=T` (one T, from its JSON
object) or `each=T` (a list of T). Decoding tolerates what the wire may hold from another version: keys this
version does not know are kept in `extra` (and given back by `to_dict`, so that nothing a newer agent said is
lost on its way to `--json`), a key that is missing leaves its field's default, and a value of the wrong kind
where a record or a list is expected reads as none.
"""
from __future__ import annotations

from dataclasses import field, fields
from typing import Type, TypeVar

R = TypeVar("R", bound="WireRecord")


def of(kind, **options):
    """A field holding one record of `kind` (its default: the empty record, or None with `optional=True`)."""
    if options.pop("optional", False):
        return field(default=None, metadata={"of": kind}, **options)
    return field(default_factory=kind, metadata={"of": kind}, **options)


def each(kind=None, *, optional: bool = False):
    """A field holding a list (a tuple here) of records of `kind`, or of plain JSON values without one (its
    default: no items, or None with `optional=True`: a key only some answers carry)."""
    return field(default=None if optional else (), metadata={"each": kind})


def extra_keys():
    """The field that keeps the keys this version does not know."""
    return field(default_factory=dict, compare=False, repr=False)


def decode(cls, data):
    """An instance of the dataclass `cls` from a JSON object (anything else gives its defaults)."""
    data = data if isinstance(data, dict) else {}
    known, values = set(), {}
    for f in fields(cls):
        if f.name == "extra":
            continue
        known.add(f.name)
        if f.name not in data:
            continue
        values[f.name] = _decode_value(f, data[f.name])
    if any(f.name == "extra" for f in fields(cls)):
        values["extra"] = {key: value for key, value in data.items() if key not in known}
    return cls(**values)


def _decode_value(f, value):
    if "of" in f.metadata:
        if value is None and f.default is None:
            return None
        return _from(f.metadata["of"], value)
    if "each" in f.metadata:
        kind = f.metadata["each"]
        if not isinstance(value, list):
            return f.default
        return tuple(value) if kind is None else tuple(_from(kind, item) for item in value)
    return value


def _from(kind, value):
    return kind.from_dict(value) if hasattr(kind, "from_dict") else decode(kind, value)


def encode(obj, *, skip_none: tuple = ()) -> dict:
    """The JSON object of a dataclass instance: every field (in declaration order), then its extra keys; the
    fields named in `skip_none` only when they hold something (keys the wire has only in some answers)."""
    out = {}
    for f in fields(obj):
        if f.name == "extra":
            continue
        value = getattr(obj, f.name)
        if value is None and f.name in skip_none:
            continue
        out[f.name] = _encode_value(value)
    out.update(getattr(obj, "extra", None) or {})
    return out


def _encode_value(value):
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (tuple, list)):
        return [_encode_value(item) for item in value]
    return value


class WireRecord:
    """The base of every typed answer: `from_dict` reads one from the wire (decode), `to_dict` writes it back
    (encode), the fields named in SKIP_NONE only when they hold something."""

    SKIP_NONE: tuple = ()

    @classmethod
    def from_dict(cls: Type[R], data) -> R:
        return decode(cls, data)

    def to_dict(self) -> dict:
        return encode(self, skip_none=self.SKIP_NONE)
