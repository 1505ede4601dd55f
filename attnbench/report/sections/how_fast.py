"""How fast at fixed lengths: every points series (eager and GPU time with their intervals),
and block-sparse against dense attention at the same lengths."""

from __future__ import annotations

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine
from attnbench.report.sections import Section, register
from attnbench.report.tables.sparsity import sparsity_table
from attnbench.report.tables.sweep import series_groups, time_table


def render(doc: Doc, m: Machine) -> None:
    single = [
        g
        for g in series_groups(m.trials).values()
        if d.world_size(g[0]) == 1 and not g[0].impl.startswith("block-sparse")
    ]
    points = [g for g in single if g[0].kind == "points"]
    searches = [g for g in single if g[0].kind == "max-seq"]
    if points or searches:
        # without a fixed-length series, the searches' own trials say how fast
        doc.heading(4, "Each series" if points else "Each search's trials (no fixed-length series here)")
        for rows in points or searches:
            doc.heading(5, f"{d.describe(rows[0])}: {d.settings_text(rows[0])}")
            doc.add(time_table(rows))
    else:
        doc.missing("no fixed-length measurements on this machine", "points")
    sparse = sparsity_table(m.rows)
    if sparse.strip():
        doc.heading(4, "Block-sparse against dense")
        doc.add(sparse)


register(Section(20, "How fast: fixed-length measurements", render))
