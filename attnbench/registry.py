"""One way to register anything: implementations, sweep kinds, speedup strategies, report
sections and commands.

Each lives in a module of its own package and registers itself when that module is imported
(``register(...)``, or ``@app.command(...)`` for a command); the package's reader imports every
module under it first (``import_all``). Adding one is adding a module: no list to extend.
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from typing import Generic, TypeVar

T = TypeVar("T")


def import_all(package: str, first: str = "") -> None:
    """Import every module under ``package``, its subpackages' included: ``first`` (a module
    of the package) before the others, which follow by name, each subpackage's modules right
    after it, so what they register comes in one order on every machine."""
    root = importlib.import_module(package)
    for module in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: (m.name != first, m.name)):
        importlib.import_module(f"{package}.{module.name}")
        if module.ispkg:
            import_all(f"{package}.{module.name}")


def did_you_mean(name: str, names: list[str]) -> str:
    """' (did you mean NAME?)' for the registered name nearest a mistyped one ('sdpaa': sdpa),
    or '' where none is near."""
    near = difflib.get_close_matches(name, names, n=1)
    return f" (did you mean {near[0]}?)" if near else ""


class Registry(Generic[T]):
    """Entries by name, registered by the modules under ``package`` as they are imported; the
    package is imported whole (``import_all``) the first time the entries are read."""

    def __init__(self, what: str, package: str, first: str = "") -> None:
        self.what, self.package, self.first = what, package, first
        self._entries: dict[str, T] = {}
        self._imported = False

    def register(self, name: str, entry: T) -> T:
        """``entry`` under ``name``; another entry under a name already taken is an error."""
        if self._entries.get(name, entry) is not entry:
            raise ValueError(f"{self.what} {name!r} registered twice")
        self._entries[name] = entry
        return entry

    def entries(self) -> dict[str, T]:
        """Every entry by name, in the order registered."""
        if not self._imported:
            self._imported = True  # first: a module of the package reads the entries as it registers
            import_all(self.package, self.first)
        return self._entries
