"""Whether dilation pays off: the longest sequence of each dilated configuration on one device,
its memory and throughput there, and its speed against one segment without dilation."""

from __future__ import annotations

from typing import Any

from attnbench import impls
from attnbench.impls.families.dilated import DILATED
from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, memory, tok_s, tokens_cell
from attnbench.report.markdown import Table, inline
from attnbench.report.sections import Section, register
from attnbench.report.tables.sweep import MaxSeqSummary
from attnbench.results.schema import Trial


def is_dilated(head: Trial) -> bool:
    """Of the family this section compares: LongNet dilated attention on one device or over
    ranks (block-sparse's dilated_sparse pattern also takes dilation rates, but is a family of
    its own)."""
    return impls.family(head.impl, head.impl_source) == DILATED


def is_baseline(head: Trial) -> bool:
    """The configuration every other is compared with: one segment, no dilation."""
    cfg = head.config or {}
    return len(cfg.get("segment_lengths") or []) == 1 and all(r == 1 for r in cfg.get("dilation_rates") or [2])


def dilation_table(m: Machine, group: list[MaxSeqSummary]) -> tuple[Table, int | None, str]:
    """The configuration table; Dilation Impact compares tokens/s with the baseline
    configuration at the longest length every configuration ran (equal work per token)."""
    ok_rows = {s.series: {r.seq_len: r for r in d.ok(m.trials) if r.series == s.series} for s in group}
    common = set.intersection(*(set(v) for v in ok_rows.values())) if ok_rows else set()
    at = max(common) if common else None
    base = next((s for s in group if is_baseline(s.head)), None)
    base_tps = ok_rows[base.series][at].tokens_per_s if base and at else None

    def impact(s: MaxSeqSummary) -> float | None:
        mine = ok_rows[s.series][at].tokens_per_s if base_tps and at else None
        return mine / base_tps if mine else None

    def at_max(s: MaxSeqSummary, attr: str) -> Any:
        return getattr(ok_rows[s.series].get(s.max_seq_len), attr, None)

    columns = {
        "Configuration": lambda s: s.label,
        "Max Tokens": (lambda s: s.max_seq_len or None, tokens_cell),
        "Memory": (lambda s: at_max(s, "peak_bytes"), memory),
        "Throughput": (lambda s: at_max(s, "tokens_per_s"), tok_s),
        "Dilation Impact": (impact, lambda v: f"{v:.2f}x"),
        "Stopped By": lambda s: s.stopped_by,
    }
    return Table.of("dilation-configurations", columns, group), at, base.label if base else ""


def render(doc: Doc, m: Machine) -> None:
    groups: dict[tuple, list[MaxSeqSummary]] = {}
    for s in m.summaries:
        if s.world_size == 1 and is_dilated(s.head):
            groups.setdefault(d.settings_key(s.head), []).append(s)
    if not groups:  # a seed's workload: named only where a run measured it
        return
    for group in groups.values():
        table, at, base = dilation_table(m, group)
        doc.heading(4, d.settings_text(group[0].head))
        doc.table(table)
        if base and at:
            doc.add(
                f"\nMemory and Throughput at each configuration's Max Tokens. Dilation Impact: tokens/s relative to "
                f"'{inline(base)}' at N={at:,}, the longest length every configuration ran.\n"
            )
        else:
            doc.add(
                "\nDilation Impact needs a single-segment, dilation-1 configuration and a length every "
                "configuration ran; this group has none.\n"
            )


register(Section(40, "Dilation: dilated configurations on one device", render))
