"""Training: per configuration, the longest sequence a forward-plus-backward step ran, its
peak over the training floor and its useful TFLOP/s (``report.tables.training``)."""

from __future__ import annotations

from attnbench.report.document import Doc, Machine
from attnbench.report.sections import Section, register
from attnbench.report.tables.training import NOTE, training_records, training_table


def render(doc: Doc, m: Machine) -> None:
    records = training_records(m.rows)
    if not records:
        doc.missing("no forward-plus-backward trials", "training")
        return
    doc.table(training_table(records))
    doc.add("\n" + NOTE)


register(Section(30, "Training: forward plus backward", render))
