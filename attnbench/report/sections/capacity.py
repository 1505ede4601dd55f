"""How well memory predicts capacity: the fit of peak memory against sequence length per series,
and its prediction against the longest sequence measured on the same device. Predictions stay
on the device the fit was measured on: a fit says nothing certain about another device's
allocator, context or kernels."""

from __future__ import annotations

from typing import Any

from attnbench.report.data import is_superseded
from attnbench.report.document import Doc, Machine, distinct, memory, pct, tokens_cell, yes_no
from attnbench.report.fit import ACCURACY_TARGET, MIN_TRIALS_FOR_TARGET, Capacity, fit_miss_cause
from attnbench.report.markdown import Table, inline
from attnbench.report.sections import Section, register


def capacity_records(caps: list[Capacity]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(fit, prediction on the measured device) records per fitted series."""
    fits, here = [], []
    for c in caps:
        ranks = "GPUs" if c.device == "cuda" else "processes"
        name = c.label + (
            f" ({c.world_size} {ranks})" if c.world_size > 1 and f" x{c.world_size}" not in c.label else ""
        )
        fits.append(
            {
                "Implementation": name,
                "Dtype": c.head.dtype,
                "Model": ("quadratic" if c.fit.degree == 2 else "linear") + f": peak ≈ {c.fit.formula()}",
                "Successful Trials": c.successful,
                "Max Fit Error": c.fit.max_error,
                "Fit Error at Largest N": c.fit.error_at_largest,
            }
        )
        here.append(
            {
                "Implementation": name,
                "Device Memory": c.device_total,
                "Set Aside": c.overhead,
                "Budget": c.budget,
                "Predicted Max": c.predicted,
                "Measured Max": c.measured_max,
                "Stopped By": c.stopped_by,
                "Prediction Error": c.error,
                "Within 5%": (abs(c.error) <= ACCURACY_TARGET) if c.target_applies and c.error is not None else None,
                "Note": fit_miss_cause(c) if c.error is not None and abs(c.error) > ACCURACY_TARGET else "",
            }
        )
    return fits, here


def render(doc: Doc, m: Machine) -> None:
    caps = [c for c in m.capacities if c.fit and not is_superseded(c.label)]
    if not caps:
        doc.missing("no series with enough successful trials to fit (2 lengths, 3 for a quadratic model)", "single")
    else:
        capacity_tables(doc, caps)
    for c in m.capacities:
        if not c.fit and not is_superseded(c.label):
            doc.add(
                f"\nNot fitted: {inline(c.label)} ({c.successful_lengths} successful lengths; a "
                f"{'quadratic' if c.degree == 2 else 'linear'} model needs {c.degree + 1}).\n"
            )


def capacity_tables(doc: Doc, caps: list[Capacity]) -> None:
    fits, here = capacity_records(caps)
    doc.add(
        "Peak memory of one device (`max_memory_reserved` on a GPU, the allocator's whole footprint,\n"
        "fragmentation included; resident-set growth on a CPU) fitted against sequence length over each\n"
        "series' successful trials by least squares (linear; quadratic where N × N scores are held). Max Fit\n"
        "Error: the largest relative error of the fit on the measured points (small lengths, where fixed costs\n"
        "dominate, weigh most); Fit Error at Largest N: its error at the longest measured length. Series a\n"
        "newer version of the code measured again are left out (their trials are in `csv/trials-*.csv`).\n"
    )
    doc.table(
        Table(
            "capacity-fit",
            list(fits[0]),
            fits,
            {"Max Fit Error": lambda v: f"{v * 100:.1f}%", "Fit Error at Largest N": pct},
        )
    )
    doc.add(
        "\nOn the measured device: Predicted Max solves the fit for Budget, the memory the allocator can use "
        "(Device Memory minus Set Aside); Prediction Error compares it with the measured max-seq where memory "
        f"stopped the search. Target: within {ACCURACY_TARGET:.0%} for every GPU series with at least "
        f"{MIN_TRIALS_FOR_TARGET} successful trials.\n"
    )
    doc.table(
        Table(
            "capacity-measured",
            list(here[0]),
            here,
            {
                "Device Memory": memory,
                "Set Aside": memory,
                "Budget": memory,
                "Predicted Max": tokens_cell,
                "Measured Max": tokens_cell,
                "Prediction Error": pct,
                "Within 5%": yes_no,
            },
        )
    )
    doc.add("\nAssumption: " + "; ".join(distinct(c.budget_note for c in caps)) + ".\n")


register(Section(70, "Capacity: memory fits against the measured maximum", render))
