"""The report's detailed sections, below the answer: one module each, named by the question it
answers. A section module defines ``render(doc, machine)``, which writes one machine's part
into a ``Doc`` (``attnbench.report.document``) from that machine's rows alone, and registers
it: ``register(Section(ORDER, TITLE, render))``, its place (sections appear by increasing
order, in steps of 10 so a new one fits between two) and its heading. Adding a section is
adding one module to this package: ``sections()`` imports every module in it. The same
sections, but those marked ``report_only``, are a results directory's ``sweep.md``
(``report.run_files``).

A table whose rows are missing says which ``attnbench`` command produces them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attnbench.registry import Registry
from attnbench.report.document import Doc, Machine


@dataclass(frozen=True)
class Section:
    order: float
    title: str
    render: Callable[[Doc, Machine], None]
    report_only: bool = False  # not in a results directory's sweep.md (figures: the report draws them)

    @property
    def module(self) -> str:
        return self.render.__module__


# the sections, each registered by its module in this package
SECTIONS: Registry[Section] = Registry("report section", __name__)


def register(section: Section) -> Section:
    return SECTIONS.register(section.title, section)


def sections() -> list[Section]:
    """Every section of this package, in report order."""
    return sorted(SECTIONS.entries().values(), key=lambda s: (s.order, s.module))
