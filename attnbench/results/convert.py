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
import sys
import types
import typing
from collections.abc import Callable
from typing import Any, Union

from attnbench.errors import AttnbenchError


class SchemaError(AttnbenchError):
    """A row that does not match its kind's schema; the message names the field."""


# A row's own bookkeeping, never one of its stored values: its keys this version does not know
# (``extra``), the file a reader found it in (``source``), a built row's key order (``layout``).
# Marked on the field, so a field of the same name elsewhere (a job's spec, a typed part) is data.
ROW_OWN = "attnbench.row_own"


def row_own(**kwargs: Any) -> Any:
    """A row's own bookkeeping field (``dataclasses.field`` arguments): not written, not read."""
    return dataclasses.field(metadata={ROW_OWN: True}, **kwargs)


@functools.cache
def row_own_fields(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get(ROW_OWN))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """How a class is read, worked out once per class: its stored fields (name, the text that
    names it in an error, required, nullable, converter), the same by name, the required ones,
    every field name, whether it keeps unknown keys (``extra``) and the keys as given (``layout``)."""

    fields: tuple[tuple[str, str, bool, bool, Callable[[Any, str, bool], Any]], ...]
    by_name: dict[str, tuple[str, str, bool, bool, Callable[[Any, str, bool], Any]]]
    required: frozenset[str]
    factories: tuple[tuple[str, Callable[[], Any]], ...]  # fields whose default is made afresh (``extra``)
    known: frozenset[str]
    own: frozenset[str]  # row_own fields
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
        if not f.metadata.get(ROW_OWN)
    )
    known = frozenset(f.name for f in dataclasses.fields(cls))
    own = row_own_fields(cls)
    required = frozenset(f[0] for f in fields if f[2])
    factories = tuple(
        (f.name, f.default_factory) for f in dataclasses.fields(cls) if f.default_factory is not dataclasses.MISSING
    )
    return _Plan(fields, {f[0]: f for f in fields}, required, factories, known, own, "extra" in own, "layout" in own)


def from_json(cls: type, d: dict[str, Any], what: str, built: bool = False) -> Any:
    plan = _plan(cls)
    try:
        kwargs = _read(plan, d, built)
    except SchemaError:  # read again in field order, to name the first bad field
        kwargs = _read_checked(plan, d, what, built)
    if plan.layout and built:
        kwargs["layout"] = tuple(d)
    return _instance(cls, plan, kwargs)


def _instance(cls: type, plan: _Plan, values: dict[str, Any]) -> Any:
    """An instance of dataclass ``cls`` holding ``values`` alone: a field it lacks reads its
    default from the class, where a dataclass keeps it (a row records a third of its class's
    fields; holding the rest as None in every row would double its memory, and its
    ``__init__`` of all of them its time)."""
    for name, make in plan.factories:
        if name not in values:
            values[name] = make()
    obj, put = object.__new__(cls), object.__setattr__  # a frozen class's fields are set as its __init__ sets them
    for name, value in values.items():  # one by one, as __init__ sets them (a dict copied whole takes more memory)
        put(obj, name, value)
    return obj


def replaced(obj: Any, **changes: Any) -> Any:
    """``dataclasses.replace`` for a row read by ``from_json``: a copy holding its values and
    ``changes`` alone, its other fields still the class's defaults."""
    return _instance(type(obj), _plan(type(obj)), {**vars(obj), **changes})


def _read(plan: _Plan, d: dict[str, Any], built: bool) -> dict[str, Any]:
    """The constructor's arguments for a valid ``d``, from its own keys alone (a row holds a
    third of its class's fields: the others stay at their defaults); a SchemaError without
    saying where for anything else."""
    kwargs: dict[str, Any] = {}
    unknown: dict[str, Any] = {}
    by_name = plan.by_name
    for name, value in d.items():
        spec = by_name.get(name)
        if spec is None:
            unknown[name] = value
        elif value is not None or spec[2] or spec[3]:
            kwargs[name] = spec[4](value, "", built)
    if not plan.required <= kwargs.keys() or (unknown and not plan.extra):
        raise SchemaError("")
    if plan.extra:
        kwargs["extra"] = unknown
    return kwargs


def _read_checked(plan: _Plan, d: dict[str, Any], what: str, built: bool) -> dict[str, Any]:
    """``_read`` field by field, in the class's order: the SchemaError names the first bad one."""
    kwargs: dict[str, Any] = {}
    for name, label, required, optional, convert in plan.fields:
        value = d.get(name, _ABSENT)
        if value is _ABSENT or (value is None and not required and not optional):
            if required:
                raise SchemaError(f"{what}: missing field {name!r}")
            continue  # the default stands for "not recorded"
        kwargs[name] = convert(value, what + label, built)
    unknown = {k: v for k, v in d.items() if k not in plan.known or k in plan.own}
    if plan.extra:
        kwargs["extra"] = unknown
    elif unknown:  # a part a worker sent: its fields are this version's own
        raise SchemaError(f"{what}: unknown field {next(iter(unknown))!r}")
    return kwargs


_ABSENT = object()


def _optional(tp: Any) -> bool:
    return _is_union(tp) and type(None) in typing.get_args(tp)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


@functools.cache
def _converter(tp: Any, nullable: bool = False) -> Callable[[Any, str, bool], Any]:
    """The conversion of a JSON value to ``tp`` (checked), ``(value, where, built) -> value``,
    built once per type: a reader converts every field of every row through it, in one call
    (``nullable``: null is a value, the "not recorded" of an optional field)."""
    if _is_union(tp):
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _converter(inner, type(None) in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):

        def record(value, where, built):
            if value is None and nullable:
                return None
            if not isinstance(value, dict):
                raise SchemaError(f"{where} is {_json_type(value)}, expected an object")
            return from_json(tp, value, where, built)

        return record
    origin = typing.get_origin(tp) or tp
    if origin is list:
        (item,) = typing.get_args(tp) or (Any,)
        convert = _converter(item)
        kept = _KEPT.get(item, frozenset())

        def listed(value, where, built):
            if value is None and nullable:
                return None
            if not isinstance(value, list):
                raise SchemaError(f"{where} is {_json_type(value)}, expected a list")
            if set(map(type, value)) <= kept:  # the samples of a row: checked whole, not item by item
                return list(value)
            try:
                return [convert(v, where, built) for v in value]
            except SchemaError:  # again, naming the item (its index costs a string per item)
                return [convert(v, f"{where}[{i}]", built) for i, v in enumerate(value)]

        return listed
    if origin is tuple:  # a fixed-length tuple, sent as a list
        parts = [_converter(a) for a in typing.get_args(tp)]

        def tupled(value, where, built):
            if value is None and nullable:
                return None
            if not isinstance(value, (list, tuple)) or len(value) != len(parts):
                raise SchemaError(f"{where} is {_json_type(value)} {_short(value)}, expected a list of {len(parts)}")
            return tuple(convert(v, where, built) for convert, v in zip(parts, value))

        return tupled
    if tp is Any:
        return lambda value, where, built: value
    exact = {float: (float, int), int: (int,), str: (str,), bool: (bool,), dict: (dict,)}.get(origin, ())

    def scalar(value, where, built):
        kind = type(value)
        if kind in exact:  # the types json.loads gives (a bool is not a number)
            if kind is str:  # a word rows repeat (an implementation, a dtype, a status, the run) is held once
                return sys.intern(value) if len(value) <= _WORD else value
            return float(value) if kind is int and origin is float and not built else value
        if value is None:
            if nullable:
                return None
            raise SchemaError(f"{where} is null, expected {_NAMES.get(origin, getattr(origin, '__name__', origin))}")
        if _matches(value, origin):
            return float(value) if origin is float and not built else value
        raise SchemaError(
            f"{where} is {_json_type(value)} {_short(value)}, expected {_NAMES.get(origin, origin.__name__)}"
        )

    return scalar


_WORD = 64  # longer strings (messages, commands, paths) are seldom repeated

# The JSON types a list's items keep as they are, by the item's type (an integer among numbers becomes a float).
_KEPT = {float: frozenset({float}), int: frozenset({int}), str: frozenset({str}), bool: frozenset({bool})}


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


def to_json(obj: Any, nulls: bool = False) -> Any:
    """``obj`` as JSON values; a field holding None is left out (a row's "not recorded"), or
    written as null with ``nulls`` (a job's spec and result: every field sent)."""
    if dataclasses.is_dataclass(obj):
        own = row_own_fields(type(obj))
        extra = obj.extra if "extra" in own else {}
        out = {
            k: to_json(extra[k] if k in extra else getattr(obj, k), nulls)
            for k in (obj.layout if "layout" in own else ())
        }
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if f.name not in own and f.name not in out and (value is not None or nulls):
                out[f.name] = to_json(value, nulls)
        out.update(extra)
        return out
    if isinstance(obj, list):
        return [to_json(v, nulls) for v in obj]
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
