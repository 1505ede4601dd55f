"""The report's detailed sections, below the answer: one module each, named by the question it
answers. A section module holds ``TITLE`` (its heading), ``ORDER`` (its place: sections appear
by increasing ``ORDER``) and ``render(doc, machine)``, which writes one machine's part into a
``Doc`` (``attnbench.report.document``) from that machine's rows alone. Adding a section is
adding one module to this package: ``sections()`` finds every module in it.

A table whose rows are missing says which ``attnbench`` command produces them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass

from attnbench.report.document import Doc, Machine


@dataclass(frozen=True)
class Section:
    order: float
    title: str
    render: Callable[[Doc, Machine], None]
    module: str


def sections() -> list[Section]:
    """Every section module of this package, in report order."""
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "render"):
            found.append(Section(float(module.ORDER), module.TITLE, module.render, module.__name__))
    return sorted(found, key=lambda s: (s.order, s.module))
