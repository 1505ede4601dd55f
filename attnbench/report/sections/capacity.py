"""How well memory predicts capacity: the fit of peak memory against sequence length per series,
and its prediction against the longest sequence measured on the same device. Predictions stay
on the device the fit was measured on: a fit says nothing certain about another device's
allocator, context or kernels."""

from __future__ import annotations

from collections import Counter

from attnbench.report.document import Doc, Machine, distinct, memory, pct, tokens_cell, yes_no
from attnbench.report.fit import ACCURACY_TARGET, MIN_TRIALS_FOR_TARGET, Capacity, capacity_note
from attnbench.report.markdown import Table, inline
from attnbench.report.sections import Section, register
from attnbench.results.series import is_superseded


def _name(c: Capacity) -> str:
    ranks = "GPUs" if c.device == "cuda" else "processes"
    return c.label + (f" ({c.world_size} {ranks})" if c.world_size > 1 and f" x{c.world_size}" not in c.label else "")


FIT_COLUMNS = {
    "Implementation": _name,
    "Dtype": lambda c: c.head.dtype,
    "Model": lambda c: ("quadratic" if c.fit.degree == 2 else "linear") + f": peak ≈ {c.fit.formula()}",
    "Successful Trials": lambda c: c.successful,
    "Max Fit Error": (lambda c: c.fit.max_error, lambda v: f"{v * 100:.1f}%"),
    "Fit Error at Largest N": (lambda c: c.fit.error_at_largest, pct),
}
# the prediction on the device the fit was measured on
MEASURED_COLUMNS = {
    "Implementation": _name,
    "Device Memory": (lambda c: c.device_total, memory),
    "Set Aside": (lambda c: c.overhead, memory),
    "Budget": (lambda c: c.budget, memory),
    "Predicted Max": (lambda c: c.predicted, tokens_cell),
    "Measured Max": (lambda c: c.measured_max, tokens_cell),
    "Stopped By": lambda c: c.stopped_by,
    "Prediction Error": (lambda c: c.error, pct),
    "Within 5%": (
        lambda c: (abs(c.error) <= ACCURACY_TARGET) if c.target_applies and c.error is not None else None,
        yes_no,
    ),
    "Note": capacity_note,
}


def render(doc: Doc, m: Machine) -> None:
    caps = [c for c in m.capacities if c.fit and not is_superseded(c.label)]
    if not caps:
        doc.missing("no series with enough successful trials to fit (2 lengths, 3 for a quadratic model)", "single")
    else:
        capacity_tables(doc, caps)
    # one line for all: a series of one length is common (a speed point) and no news
    unfitted = Counter(
        (inline(c.label), c.successful_lengths, c.degree + 1)
        for c in m.capacities
        if not c.fit and not is_superseded(c.label)
    )
    if unfitted:
        doc.add(
            "\nNot fitted (successful lengths of those a linear model needs, 2, or a quadratic, 3): "
            + "; ".join(
                f"{lab} ({k} of {need}{f', {n} series' if n > 1 else ''})" for (lab, k, need), n in unfitted.items()
            )
            + ".\n"
        )


def capacity_tables(doc: Doc, caps: list[Capacity]) -> None:
    doc.add(
        "Peak memory of one device (`max_memory_reserved` on a GPU, the allocator's whole footprint,\n"
        "fragmentation included; resident-set growth on a CPU) fitted against sequence length over each\n"
        "series' successful trials by least squares (linear; quadratic where N × N scores are held). Max Fit\n"
        "Error: the largest relative error of the fit on the measured points (small lengths, where fixed costs\n"
        "dominate, weigh most); Fit Error at Largest N: its error at the longest measured length. Series a\n"
        "newer version of the code measured again are left out (their trials are in `csv/trials-*.csv`).\n"
    )
    doc.table(Table.of("capacity-fit", FIT_COLUMNS, caps))
    doc.add(
        "\nOn the measured device: Predicted Max solves the fit for Budget, the memory the allocator can use "
        "(Device Memory minus Set Aside); Prediction Error compares it with the measured max-seq where memory "
        f"stopped the search. Target: within {ACCURACY_TARGET:.0%} for every GPU series with at least "
        f"{MIN_TRIALS_FOR_TARGET} successful trials.\n"
    )
    doc.table(Table.of("capacity-measured", MEASURED_COLUMNS, caps))
    doc.add("\nAssumption: " + "; ".join(distinct(c.budget_note for c in caps)) + ".\n")


register(Section(70, "Capacity: memory fits against the measured maximum", render))
