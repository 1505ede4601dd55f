"""What an implementation's configuration holds, declared without torch: its parameters by
name, each value of a parameter's kind (``impls.entry.Param.kind``), JSON as a row records it."""

from __future__ import annotations

#: a parameter's value: int, float, str, ints (a list of ints) or bool; None where unset
ParamValue = int | float | str | bool | list[int] | tuple[int, ...] | None
Config = dict[str, ParamValue]
