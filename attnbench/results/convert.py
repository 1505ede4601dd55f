"""Rows to JSON and back: the conversion ``schema`` uses for every row kind and the typed
parts a worker process sends (a dataclass each).

``from_json`` checks the presence and JSON type of every field against the class's
annotations and names the first bad one in a ``SchemaError``; keys the class does not know
go to its ``extra`` (a row of a newer attnbench), or are an error for a part without one.
``to_json`` gives the object back: a built row key for key as it was given (its ``layout``),
else every field that holds a value.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Union

from attnbench.errors import AttnbenchError


class SchemaError(AttnbenchError):
    """A row that does not match its kind's schema; the message names the field."""


NOT_STORED = ("extra", "source", "layout")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def from_json(cls: type, d: dict[str, Any], what: str, built: bool = False) -> Any:
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in NOT_STORED:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in d or (d[f.name] is None and not required and not _optional(hints[f.name])):
            if required:
                raise SchemaError(f"{what}: missing field {f.name!r}")
            continue  # the default stands for "not recorded"
        kwargs[f.name] = _convert(d[f.name], hints[f.name], f"{what}: field {f.name!r}", built)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = {k: v for k, v in d.items() if k not in known or k in NOT_STORED}
    if "extra" in known:
        kwargs["extra"] = unknown
    elif unknown:  # a part a worker sent: its fields are this version's own
        raise SchemaError(f"{what}: unknown field {next(iter(unknown))!r}")
    if "layout" in known:
        kwargs["layout"] = tuple(d) if built else ()
    return cls(**kwargs)


def _optional(tp: Any) -> bool:
    return _is_union(tp) and type(None) in typing.get_args(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _convert(value: Any, tp: Any, where: str, built: bool = False) -> Any:
    if _is_union(tp):
        if value is None and type(None) in typing.get_args(tp):
            return None
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise SchemaError(f"{where} is {_json_type(value)}, expected an object")
        return from_json(tp, value, where, built)
    origin = typing.get_origin(tp) or tp
    if origin is list:
        if not isinstance(value, list):
            raise SchemaError(f"{where} is {_json_type(value)}, expected a list")
        (item,) = typing.get_args(tp) or (Any,)
        return [_convert(v, item, f"{where}[{i}]", built) for i, v in enumerate(value)]
    if value is None and tp is not Any:
        raise SchemaError(f"{where} is null, expected {_NAMES.get(origin, getattr(origin, '__name__', origin))}")
    if tp is Any or _matches(value, origin):
        return float(value) if origin is float and not built else value
    raise SchemaError(f"{where} is {_json_type(value)} {_short(value)}, expected {_NAMES.get(origin, origin.__name__)}")


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object"}


def _matches(value: Any, tp: type) -> bool:
    if isinstance(value, bool):
        return tp is bool
    if tp is float:
        return isinstance(value, (int, float))
    return isinstance(value, tp)


_JSON_TYPES = {**_NAMES, bool: "a boolean", list: "a list"}


def _json_type(value: Any) -> str:
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    text = repr(value)
    return f"({text[:40]}...)" if len(text) > 40 else f"({text})"


def to_json(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        extra = getattr(obj, "extra", {})
        out = {k: to_json(extra[k] if k in extra else getattr(obj, k)) for k in getattr(obj, "layout", ())}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name not in NOT_STORED and f.name not in out and value is not None:
                out[f.name] = to_json(value)
        out.update(extra)
        return out
    if isinstance(obj, list):
        return [to_json(v) for v in obj]
    return obj


def clean_floats(row: dict[str, Any]) -> dict[str, Any]:
    """NaN and infinity are not JSON: store them as null."""

    def fix(v):
        if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
            return None
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v

    return fix(row)


def held(part: Any) -> dict[str, Any]:
    """A typed part's fields that hold a value, by name (what it adds to a row)."""
    return {f.name: getattr(part, f.name) for f in dataclasses.fields(part) if getattr(part, f.name) is not None}


def fill(record: Any, part: Any) -> None:
    """Set on ``record`` every field of ``part`` that holds a value (the names are shared)."""
    for name, value in held(part).items():
        setattr(record, name, value)
