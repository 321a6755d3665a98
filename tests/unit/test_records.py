"""A record's JSON dict: its fields in their order, some values replaced, some left out, derived keys in place."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from draftsync.records import record_dict


@dataclass(frozen=True)
class Point:
    x: int
    y: int
    label: str = field(default="", kw_only=True)
    cache: list[int] = field(default_factory=list)

    @property
    def norm(self) -> int:
        return abs(self.x) + abs(self.y)


def test_the_fields_come_in_their_order():
    assert list(record_dict(Point(1, 2, label="a"))) == ["x", "y", "label", "cache"]


def test_values_replace_omit_leaves_out_and_after_adds_in_place():
    point = Point(-1, 2, label="a", cache=[3])
    out = record_dict(point, omit={"cache"}, after={"y": {"norm": point.norm}}, label="A", x=None)
    assert out == {"x": None, "y": 2, "norm": 3, "label": "A"}
    assert list(out) == ["x", "y", "norm", "label"]


def test_a_misspelt_name_is_an_error_not_a_missing_key():
    with pytest.raises(TypeError, match="lable"):
        record_dict(Point(1, 2), lable="A")
    with pytest.raises(TypeError, match="z"):
        record_dict(Point(1, 2), after={"z": {"norm": 3}})
