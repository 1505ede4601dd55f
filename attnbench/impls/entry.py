"""What the registry holds of an implementation, free of torch: its parameters, what it
supports and how to build it. Built-in implementations are declared in ``impls/families/``
with their code named by ``Lazy("module:function")``, so the registry (the command line's
checks, ``attnbench list``, the report) reads them without importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from attnbench.impls.config import ImplSource

if TYPE_CHECKING:
    from attnbench.impls.base import AttentionImpl

# installed packages name their implementations' factories in this entry-point group
ENTRY_POINT_GROUP = "attnbench.implementations"


@dataclass(frozen=True)
class Param:
    """One constructor parameter, as ``attnbench list`` and the CLI see it."""

    name: str
    default: Any
    help: str
    kind: str = "int"  # int | float | str | ints (comma-separated list of ints) | bool
    choices: tuple[str, ...] | None = None
    #: False for options added later and off by default: left out of a configuration while at
    #: their default, so earlier rows and series keys stay the same
    recorded_at_default: bool = True
    #: the value names a function as pkg.module:function (flex's mask): code from outside
    #: attnbench where the module is not attnbench's
    names_code: bool = False


@dataclass(frozen=True)
class ImplSpec:
    """A registry entry: how to build an implementation and what it supports."""

    name: str
    factory: Callable[..., AttentionImpl]
    summary: str
    params: tuple[Param, ...] = ()
    devices: tuple[str, ...] = ("cpu", "cuda")
    dtypes: tuple[str, ...] = ("fp32", "fp16", "bf16")
    # Configurations `attnbench verify` checks, each with the shapes it runs at.
    verify_configs: tuple[dict[str, Any], ...] | Callable[[str], tuple[dict[str, Any], ...]] = ({},)
    distributed: bool = False
    #: 2 when peak memory grows with N^2 (N x N scores held), 1 when with N: the capacity fit's model
    memory_order: int = 1
    #: sequence-parallel implementations: the single-device one computing the same key sets
    #: (the report's equal-work baseline)
    counterpart: str | None = None
    #: where an outside implementation comes from: import_path, package, version (None: built in)
    source: ImplSource | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # What the report knows of it, read without importing its code (nor torch):
    #: the family it is drawn with, one panel of each figure per family (None: with the dense
    #: ones and any other); the dilation section compares the ``dilated`` family
    family: str | None = None
    #: its configuration in a few characters, as tables name it (block-sparse's
    #: 'bs:local_window 5%/128'); None: its name
    short_name: Callable[[dict[str, Any]], str] | None = None
    #: the parameters ``short_name`` shows, which a label then leaves out
    shown: tuple[str, ...] = ()


@dataclass
class SpecFields:
    """An outside implementation's ``ImplSpec`` as a worker that imported it reads it (its
    factory stays there): sent to attnbench's own process, which never imports the code."""

    summary: str
    params: list[tuple[str, Any, str, str]]  # (name, default, help, kind)
    devices: list[str]
    dtypes: list[str]
    memory_order: int
    code_source: dict[str, Any] | None = None  # the spec's ``source``: where its code came from
    distributed: bool = False
    counterpart: str | None = None


@dataclass
class Described:
    """What attnbench's own process needs to know of one built outside implementation, read in
    a worker process (``outside.described``) and held by ``outside.DescribedImpl``."""

    config: dict[str, Any]
    granularity: int
    min_seq_len: int
    verify_seq_len: int
    compiles: bool
    supports_causal: bool
    supports_gqa: bool
    counted_pairs: bool
    dense_by_default: bool
    declares: str
    gqa_mapping: str
    pairs_source: str | None = None
    code_source: dict[str, Any] | None = None  # its ``source``: where its code came from, what it declares
    shard_layout: str | None = None  # a sequence-parallel one's ``layout``: its shape rules at any number of ranks
    rank_granularity: int = 1


@dataclass(frozen=True)
class Lazy:
    """The function or class ``ref`` names as ``"module:name"``, imported on its first call: a
    declaration names an implementation's code without importing it (nor torch)."""

    ref: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.target()(*args, **kwargs)

    def target(self) -> Callable[..., Any]:
        module, _, name = self.ref.partition(":")
        return getattr(importlib.import_module(module), name)


def package_family(package: str | None) -> str | None:
    """The family an outside implementation is drawn with: the package it comes from, less the
    ``attnbench-`` a plugin's name starts with ('attnbench-sliding-window': 'sliding window');
    None where it comes from no installed package."""
    return package.removeprefix("attnbench-").replace("-", " ") if package else None


def is_import_path(name: str) -> bool:
    return ":" in name


def entry_points() -> dict[str, str]:
    """Installed implementations: entry-point name -> import path (nothing is imported)."""
    return {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
