"""Dilation configurations and multi-GPU scaling (seed report 003): the maximum sequence per
dilated configuration on one GPU, multi-GPU ring trials, and theoretical against actual scaling."""

from __future__ import annotations

from typing import Any

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, gb, ms, tok_s, tokens_cell
from attnbench.report.markdown import Table
from attnbench.report.multigpu import scaling_families

# LongNet dilated attention on one device or over ranks; block-sparse's dilated_sparse
# pattern also takes dilation rates, but it is not what report 003 compares
DILATED_IMPLS = ("dilated", "ring-dilated", "ring-dilated-hilbert")


def is_dilated(head: dict[str, Any]) -> bool:
    return head.get("impl") in DILATED_IMPLS


def is_baseline(head: dict[str, Any]) -> bool:
    """Report 003's baseline: one segment, no dilation."""
    cfg = head.get("config") or {}
    return len(cfg.get("segment_lengths") or []) == 1 and all(r == 1 for r in cfg.get("dilation_rates") or [2])


def dilation_records(m: Machine, group: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int | None, str]:
    """Rows of the configuration table; Dilation Impact compares tokens/s with the baseline
    configuration at the longest length every configuration ran (equal work per token)."""
    ok_rows = {s["series"]: {r["seq_len"]: r for r in d.ok(m.trials) if r["series"] == s["series"]} for s in group}
    common = set.intersection(*(set(v) for v in ok_rows.values())) if ok_rows else set()
    at = max(common) if common else None
    base = next((s for s in group if is_baseline(s["head"])), None)
    base_tps = ok_rows[base["series"]][at].get("tokens_per_s") if base and at else None
    records = []
    for s in group:
        best = ok_rows[s["series"]].get(s["max_seq_len"])
        impact = None
        if base_tps and at:
            mine = ok_rows[s["series"]][at].get("tokens_per_s")
            impact = mine / base_tps if mine else None
        records.append(
            {
                "Configuration": s["label"],
                "Max Tokens": s["max_seq_len"] or None,
                "Memory": best.get("peak_bytes") if best else None,
                "Throughput": best.get("tokens_per_s") if best else None,
                "Dilation Impact": impact,
                "Stopped By": s["stopped_by"],
            }
        )
    return records, at, base["label"] if base else ""


def dilation_configurations(doc: Doc, m: Machine) -> None:
    doc.heading(4, "Single GPU: maximum sequence per configuration")
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for s in m.summaries:
        if s["world_size"] == 1 and is_dilated(s["head"]):
            groups.setdefault(d.settings_key(s["head"]), []).append(s)
    if not groups:
        doc.missing("no single-GPU max-seq search of a dilated configuration on this machine", "seed-003")
    for group in groups.values():
        records, at, base = dilation_records(m, group)
        doc.heading(5, d.settings_text(group[0]["head"]))
        doc.table(
            Table(
                "003-configurations",
                ["Configuration", "Max Tokens", "Memory", "Throughput", "Dilation Impact", "Stopped By"],
                records,
                {
                    "Max Tokens": tokens_cell,
                    "Memory": gb,
                    "Throughput": tok_s,
                    "Dilation Impact": lambda v: f"{v:.2f}x",
                },
            )
        )
        if base and at:
            doc.add(
                f"\nMemory and Throughput at each configuration's Max Tokens. Dilation Impact: tokens/s relative to "
                f"'{base}' at N={at:,}, the longest length every configuration ran.\n"
            )
        else:
            doc.add(
                "\nDilation Impact needs a single-segment, dilation-1 configuration and a length every "
                "configuration ran; this group has none.\n"
            )
    doc.heading(4, "Multi-GPU results")
    multi = sorted(
        (r for r in d.ok(m.trials) if d.world_size(r) > 1), key=lambda r: (d.world_size(r), r["seq_len"], d.describe(r))
    )
    if not multi:
        doc.missing("no multi-GPU ring trials on this machine", "ring-points")
    for p in sorted({d.world_size(r) for r in multi}):
        doc.heading(5, f"{p} GPUs")
        doc.table(
            Table(
                "003-distributed",
                ["Sequence", "Configuration", "Time", "Throughput", "Memory/GPU"],
                [
                    {
                        "Sequence": r["seq_len"],
                        "Configuration": d.describe(r),
                        "Time": r.get("time_ms"),
                        "Throughput": r.get("tokens_per_s"),
                        "Memory/GPU": d.peak_per_gpu(r),
                    }
                    for r in multi
                    if d.world_size(r) == p
                ],
                {"Sequence": tokens_cell, "Time": ms, "Throughput": tok_s, "Memory/GPU": gb},
            )
        )
    doc.heading(4, "Scaling: theoretical vs actual")
    families = scaling_families(m.rows)
    if not families:
        doc.missing("no multi-GPU max-seq search on this machine", "ring-max-seq")
    caps = {c.series: c for c in m.capacities}
    for fam in families:
        single = fam["single"]
        doc.heading(5, f"{d.describe(fam['head'])}: {d.settings_text(fam['head'])}")
        one = single["max_seq_len"] if single else None
        records = []
        if single:
            c1 = caps.get(single["series"])
            records.append({"GPUs": 1, "Theoretical Max": one, "Expected": c1.predicted if c1 else None, "Actual": one})
        for s in fam["multi"]:
            cp = caps.get(s["series"])
            records.append(
                {
                    "GPUs": s["world_size"],
                    "Theoretical Max": one * s["world_size"] if one else None,
                    "Expected": cp.predicted if cp else None,
                    "Actual": s["max_seq_len"] or None,
                }
            )
        doc.table(
            Table(
                "003-scaling",
                ["GPUs", "Theoretical Max", "Expected", "Actual"],
                records,
                {"Theoretical Max": tokens_cell, "Expected": tokens_cell, "Actual": tokens_cell},
            )
        )
        doc.add(
            "\nTheoretical Max: GPUs × the measured single-GPU maximum (memory split perfectly, O(N/P) per GPU)"
            + ("" if single else "; no single-GPU max-seq of this configuration was measured here")
            + ". Expected: the capacity fit of that GPU count's own per-GPU peaks, solved for this GPU's memory. "
            "Actual: the measured max-seq.\n"
        )
