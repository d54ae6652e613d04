"""Every record of `taperlm.compare.results` (those it defines, and the novelty records it
takes from `taperlm.analysis.novelty_record`) round-trips its JSON: an instance built from its
type hints (every optional part present, then every optional part None) written with `to_json`,
passed through JSON text and read back with `from_json` writes the same JSON again, key order
included. A record added to results.py is covered without a line here."""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest

from taperlm.analysis import novelty_record
from taperlm.compare import results

pytestmark = pytest.mark.unit

RECORDS = sorted(
    (
        cls
        for _, cls in inspect.getmembers(results, inspect.isclass)
        if cls.__module__ in (results.__name__, novelty_record.__name__)
        and dataclasses.is_dataclass(cls)
        and hasattr(cls, "to_json")
    ),
    key=lambda cls: cls.__name__,
)


def sample(hint: Any, full: bool) -> Any:
    """A value of type `hint`: `full` fills every optional part, otherwise it is None."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return sample(rest[0], full) if full or len(rest) == len(args) else None
    if hint is Any:
        return "any"
    if hint is bool:
        return True
    if hint is int:
        return 3
    if hint is float:
        return 0.25
    if hint is str:
        return "s"
    if hint is Path:
        return Path("out")
    if origin is list:
        return [sample(args[0], full)]
    if origin is dict:
        return {"k": sample(args[1], full)}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return (sample(args[0], full),)
        return tuple(sample(a, full) for a in args)
    if dataclasses.is_dataclass(hint):
        return instance(hint, full)
    raise AssertionError(f"no sample of {hint!r}: add it to the test")


def instance(cls: type, full: bool) -> Any:
    hints = typing.get_type_hints(cls, vars(sys.modules[cls.__module__]))
    return cls(**{f.name: sample(hints[f.name], full) for f in dataclasses.fields(cls) if f.init})


def read_back(cls: type, data: Any) -> Any:
    if cls is results.ComparisonReport:
        return cls.from_json(data, Path("out"))
    return cls.from_json(data)


def test_every_record_is_found():
    names = {cls.__name__ for cls in RECORDS}
    # the records a study reads (a sample: the enumeration must not come up empty)
    assert {
        "CellResult",
        "ComparisonReport",
        "ReportMeta",
        "NoveltyRecord",
        "SessionRecord",
    } <= names


@pytest.mark.parametrize("full", [True, False], ids=["full", "optional-none"])
@pytest.mark.parametrize("cls", RECORDS, ids=lambda cls: cls.__name__)
def test_every_record_round_trips_its_json(cls, full):
    record = instance(cls, full)
    text = json.dumps(record.to_json())
    again = read_back(cls, json.loads(text))
    assert json.dumps(again.to_json()) == text
