"""What an implementation's configuration holds, declared without torch: its parameters by
name, each value of a parameter's kind (``impls.entry.Param.kind``), JSON as a row records it."""

from __future__ import annotations

from typing import TypedDict

#: a parameter's value: int, float, str, ints (a list of ints) or bool; None where unset
ParamValue = int | float | str | bool | list[int] | tuple[int, ...] | None
Config = dict[str, ParamValue]


class SequenceParallelDeclaration(TypedDict):
    """An outside implementation's ``sequence_parallel`` declaration, checked: the one-device
    implementation computing the same key sets, its parameters, and the shard layout."""

    counterpart: str
    counterpart_params: Config
    layout: str


class ImplSource(TypedDict, total=False):
    """Where an outside implementation's code comes from, as its rows record it
    (``impl_source``): the report reads it without importing the code."""

    import_path: str
    package: str | None
    version: str | None
    source_sha256: str | None  # ``outside.source_hash``: two rows with one hash ran the same code
    sequence_parallel: SequenceParallelDeclaration
    memory_order: int  # the capacity fit's model (``ImplSpec.memory_order``)
