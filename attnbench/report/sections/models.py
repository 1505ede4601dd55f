"""Model shapes: attention as model presets run it (rows with a ``model``: `attnbench run
--profile models`, or any sweep given ``--model``), one line per preset and implementation
configuration, forward beside training.

Per mode: the longest sequence its search found and the allocator limit it ran under; the
whole device's longest, predicted from the series' fit of peak memory (``report.fit``);
bytes per token, the slope of the measured peak over the series' successful lengths by least
squares (fixed costs drop out), against the floor's bytes per token (q and the output at the
query heads, k and v at the key/value heads); useful TFLOP/s at the comparison length with
its interval. ``K, V`` says whether grouped K/V were shared or copied to every query head.
Reads rows only.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from attnbench.report.document import Doc, Machine
from attnbench.report.fit import Capacity, capacities
from attnbench.report.intervals import tflops_cell, tflops_interval
from attnbench.report.markdown import Table
from attnbench.report.sections import Section, register
from attnbench.results.schema import Row
from attnbench.units import format_gib, format_tokens, short_tokens

COMPARE_AT = 32768  # the comparison length where the rows have it (the GPU profile's)
MODES = (("fwd", "Fwd"), ("fwd_bwd", "Train"))


def render(doc: Doc, machine: Machine) -> None:
    """The section: one table of the machine's model rows, or what produces them."""
    rows = [r for r in machine.rows if getattr(r, "model", None)]
    records = model_records(rows)
    if not records:
        doc.missing("no trials of a model preset", "models")
        return
    compare = compare_length(rows)
    doc.table(models_table(records, compare))
    doc.add("\n" + note(compare, any(getattr(r, "device", None) == "cuda" for r in rows)))


def compare_length(rows: list[Row]) -> int:
    """32K where a trial ran there; else the length most series ran at (the longest of those)."""
    ran = {(getattr(r, "series", None), r.seq_len) for r in rows if _is_trial(r) and getattr(r, "status", None) == "ok"}
    counts = Counter(n for _, n in ran)
    if COMPARE_AT in counts or not counts:
        return COMPARE_AT
    return max(counts, key=lambda n: (counts[n], n))


@dataclass(frozen=True)
class ModeSeries:
    """One mode's series of a model record: its trials, its search's result and its fit."""

    trials: list[Row]
    result: Row | None
    fit: Capacity | None


@dataclass(frozen=True)
class ModelRecord:
    """A (model, implementation configuration, dtype), its series by mode (``fwd``, ``fwd_bwd``)."""

    model: str
    implementation: str
    grouped: bool  # fewer key/value heads than query heads
    modes: dict[str, ModeSeries] = field(default_factory=dict)

    def trials(self) -> list[Row]:
        return [r for m, _ in MODES if m in self.modes for r in self.modes[m].trials]


@dataclass(frozen=True)
class ModeCells:
    """Raw values of one mode: longest, its limit, the predicted whole-device longest, bytes
    per token and its floor, TFLOP/s at the comparison length."""

    longest: int | None = None
    limit: int | None = None
    predicted: float | None = None
    bytes: tuple[float | None, float | None] | None = None
    tflops: Any = None  # Interval or None


def model_records(rows: list[Row]) -> list[ModelRecord]:
    """One record per (model, implementation configuration, dtype), its modes' series inside."""
    fits = {c.series: c for c in capacities(rows)}
    results = {r.series: r for r in rows if getattr(r, "kind", None) == "max-seq-result"}
    records: dict[tuple, ModelRecord] = {}
    for series, trials in _series(rows).items():
        head = trials[0]
        key = (head.model, head.impl, json.dumps(getattr(head, "config", None), sort_keys=True), head.dtype)
        rec = records.setdefault(key, _record(head))
        rec.modes[getattr(head, "mode", None) or "fwd"] = ModeSeries(trials, results.get(series), fits.get(series))
    return list(records.values())


def _is_trial(row: Row) -> bool:
    return row.kind in ("max-seq", "points")


def _series(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        if _is_trial(r):
            out.setdefault(r.series, []).append(r)
    return out


def _record(head: Row) -> ModelRecord:
    kv = getattr(head, "kv_heads", None) or head.heads
    mask = "causal" if getattr(head, "causal", None) else "no mask"
    label = getattr(head, "label", None) or head.impl
    suffix = f" for {head.model}"
    return ModelRecord(
        f"{head.model} ({head.heads} / {kv} / {head.head_dim}, {mask})",
        label[: -len(suffix)] if label.endswith(suffix) else label,
        kv != head.heads,
    )


def bytes_per_token(trials: list[Row]) -> tuple[float | None, float | None]:
    """(slope of the peak over the successful lengths, the floor's bytes per token); the slope
    needs two lengths."""
    points = sorted(
        {
            (r.seq_len, r.peak_bytes)
            for r in trials
            if getattr(r, "status", None) == "ok" and getattr(r, "peak_bytes", None)
        }
    )
    floor = next((r.floor_bytes / r.seq_len for r in trials if getattr(r, "floor_bytes", None)), None)
    if len({n for n, _ in points}) < 2:
        return None, floor
    mean_n = sum(n for n, _ in points) / len(points)
    mean_p = sum(p for _, p in points) / len(points)
    slope = sum((n - mean_n) * (p - mean_p) for n, p in points) / sum((n - mean_n) ** 2 for n, _ in points)
    return slope, floor


def _kv_cell(rec: ModelRecord) -> str:
    if not rec.grouped:
        return "-"
    layouts = {getattr(r, "kv_layout", None) for r in rec.trials() if getattr(r, "kv_layout", None)}
    if layouts:
        return " / ".join(sorted(layouts))
    return "unsupported" if _unsupported(rec) else "-"


def _unsupported(rec: ModelRecord) -> str:
    """The message of a configuration whose every trial the kernel refused ('' otherwise)."""
    trials = rec.trials()
    if trials and all(getattr(r, "status", None) == "unsupported" for r in trials):
        return trials[0].message or "unsupported"
    return ""


def _mode_cells(part: ModeSeries | None, compare: int, cuda: bool) -> ModeCells:
    if not part:
        return ModeCells()
    trials, result, fit = part.trials, part.result, part.fit
    slope, floor = bytes_per_token(trials)
    at = next((r for r in trials if r.seq_len == compare and getattr(r, "status", None) == "ok"), None)
    predicted = fit.predict_for(fit.device_total) if cuda and fit and fit.fit and fit.device_total else None
    longest = result.seq_len if result else None
    limit = trials[0].memory_limit if result else None
    return ModeCells(longest, limit, predicted, (slope, floor), tflops_interval(at) if at else None)


def models_table(records: list[ModelRecord], compare: int) -> Table:
    at = short_tokens(compare)
    rows = []  # (record, why the kernel refused it, its cells by mode)
    for rec in records:
        cuda = any(getattr(r, "device", None) == "cuda" for r in rec.trials())
        refused = _unsupported(rec)
        cells = {
            name: ModeCells() if refused else _mode_cells(rec.modes.get(mode), compare, cuda) for mode, name in MODES
        }
        rows.append((rec, refused, cells))
    columns = {"Model (H / H_kv / D)": lambda r: r[0].model, "Implementation": lambda r: r[0].implementation}
    columns["K, V"] = lambda r: _kv_cell(r[0])
    for _, name in MODES:
        columns |= {
            f"{name} TFLOP/s at {at}": (lambda r, n=name: r[2][n].tflops, tflops_cell),
            f"{name} Bytes/Token (x Floor)": (lambda r, n=name: r[2][n].bytes, _bytes_cell),
            f"{name} Longest (Under)": (
                lambda r, n=name: (r[2][n].longest, r[2][n].limit) if r[2][n].longest else None,
                _longest_cell,
            ),
            f"{name} Predicted, Whole GPU": (
                lambda r, n=name: r[2][n].predicted,
                lambda v: f"~{format_tokens(int(v))}",
            ),
        }
    columns["Note"] = lambda r: r[1]
    return Table.of("models", columns, rows)


def _bytes_cell(v) -> str:
    slope, floor = v
    if slope is None:
        return "-"
    return f"{slope:,.0f}" + (f" ({slope / floor:.2f}x)" if floor else "")


def _longest_cell(v) -> str:
    n, limit = v
    return f"{n:,}" + (f" under {format_gib(limit)}" if limit else "")


def note(compare: int, cuda: bool) -> str:
    return (
        "H / H_kv / D: query heads, key/value heads, head dimension. K, V: shared, each key/value head read "
        "by its group of query heads (no copy), or expanded, copied to every query head first. TFLOP/s: useful "
        f"pairs x 4 D (x 3.5 for a training step) over the median time at {compare:,} tokens, "
        "± half its 95% interval (n samples). Bytes/Token: the slope of the peak "
        + ("(the allocator's `max_memory_allocated`)" if cuda else "(resident-set growth; indicative on a CPU)")
        + " over each series' successful lengths, and that over the floor's (q and the output at H heads, k and "
        "v at H_kv; training adds their gradients). Longest: the longest length the search ran, under the "
        "memory limit it ran with; Predicted, Whole GPU: the length at which the series' fit of its peaks "
        "(reserved memory) reaches the device's memory less what the allocator cannot use. '-': not measured.\n"
    )


register(Section(35, "Model shapes: model presets beside the seeds' shape", render))
