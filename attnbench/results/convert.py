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
from collections.abc import Callable
from typing import Any, Union

from attnbench.errors import AttnbenchError


class SchemaError(AttnbenchError):
    """A row that does not match its kind's schema; the message names the field."""


NOT_STORED = ("extra", "source", "layout")


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How a class is read, worked out once per class: its stored fields (name, the text that
    names it in an error, required, nullable, converter), every field name, whether it keeps
    unknown keys (``extra``) and the keys as given (``layout``)."""

    fields: tuple[tuple[str, str, bool, bool, Callable[[Any, str, bool], Any]], ...]
    known: frozenset[str]
    extra: bool
    layout: bool


@functools.cache
def _plan(cls: type) -> _Plan:
    hints = _hints(cls)
    fields = tuple(
        (
            f.name,
            f": field {f.name!r}",
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            _optional(hints[f.name]),
            _converter(hints[f.name]),
        )
        for f in dataclasses.fields(cls)
        if f.name not in NOT_STORED
    )
    known = frozenset(f.name for f in dataclasses.fields(cls))
    return _Plan(fields, known, "extra" in known, "layout" in known)


def from_json(cls: type, d: dict[str, Any], what: str, built: bool = False) -> Any:
    plan = _plan(cls)
    kwargs: dict[str, Any] = {}
    for name, label, required, optional, convert in plan.fields:
        value = d.get(name, _ABSENT)
        if value is _ABSENT or (value is None and not required and not optional):
            if required:
                raise SchemaError(f"{what}: missing field {name!r}")
            continue  # the default stands for "not recorded"
        kwargs[name] = convert(value, what + label, built)
    unknown = {k: v for k, v in d.items() if k not in plan.known or k in NOT_STORED}
    if plan.extra:
        kwargs["extra"] = unknown
    elif unknown:  # a part a worker sent: its fields are this version's own
        raise SchemaError(f"{what}: unknown field {next(iter(unknown))!r}")
    if plan.layout:
        kwargs["layout"] = tuple(d) if built else ()
    return cls(**kwargs)


_ABSENT = object()


def _optional(tp: Any) -> bool:
    return _is_union(tp) and type(None) in typing.get_args(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


@functools.cache
def _converter(tp: Any) -> Callable[[Any, str, bool], Any]:
    """The conversion of a JSON value to ``tp`` (checked), ``(value, where, built) -> value``,
    built once per type: a reader converts every field of every row through it."""
    if _is_union(tp):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        convert = _converter(inner)
        nullable = type(None) in typing.get_args(tp)

        def union(value, where, built):
            return None if value is None and nullable else convert(value, where, built)

        return union
    if dataclasses.is_dataclass(tp):

        def record(value, where, built):
            if not isinstance(value, dict):
                raise SchemaError(f"{where} is {_json_type(value)}, expected an object")
            return from_json(tp, value, where, built)

        return record
    origin = typing.get_origin(tp) or tp
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        convert = _converter(item)

        def listed(value, where, built):
            if not isinstance(value, list):
                raise SchemaError(f"{where} is {_json_type(value)}, expected a list")
            try:
                return [convert(v, where, built) for v in value]
            except SchemaError:  # again, naming the item (its index costs a string per item)
                return [convert(v, f"{where}[{i}]", built) for i, v in enumerate(value)]

        return listed
    if tp is Any:
        return lambda value, where, built: value
    exact = {float: (float, int), int: (int,), str: (str,), bool: (bool,), dict: (dict,)}.get(origin, ())

    def scalar(value, where, built):
        kind = type(value)
        if kind in exact:  # the types json.loads gives (a bool is not a number)
            return float(value) if kind is int and origin is float and not built else value
        if value is None:
            raise SchemaError(f"{where} is null, expected {_NAMES.get(origin, getattr(origin, '__name__', origin))}")
        if _matches(value, origin):
            return float(value) if origin is float and not built else value
        raise SchemaError(
            f"{where} is {_json_type(value)} {_short(value)}, expected {_NAMES.get(origin, origin.__name__)}"
        )

    return scalar


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
