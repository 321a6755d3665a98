"""A typed record as the dict its JSON is: one rule for every layer, so a field added to a record reaches its JSON
without a second list of names to keep in step."""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import fields
from typing import Any


def record_dict(
    record: Any,
    /,
    *,
    omit: Container[str] = (),
    after: Mapping[str, Mapping[str, Any]] | None = None,
    **values: Any,
) -> dict[str, Any]:
    """`record`'s dataclass fields as a dict, in field order (the order users read, so reorder fields with care).

    `values` replace some fields' values (a nested record as its own dict), `omit` leaves fields out, and
    `after[name]` adds keys that are no fields (a derived figure) right after the field `name`."""
    added = after or {}
    unknown = (values.keys() | added.keys()) - {field.name for field in fields(record)}
    if unknown:  # a misspelt name would otherwise be dropped without a word
        raise TypeError(f"{type(record).__name__} has no fields {sorted(unknown)}")
    out: dict[str, Any] = {}
    for field in fields(record):
        if field.name not in omit:
            out[field.name] = values[field.name] if field.name in values else getattr(record, field.name)
        out.update(added.get(field.name, {}))
    return out
