"""The executive summary: the largest sequence per implementation and GPU count, the best
speedup, and how well capacity was predicted."""

from __future__ import annotations

from typing import Any

from attnbench.measure.stats import anomalous_efficiency
from attnbench.report import data as d
from attnbench.report.document import PRODUCERS, Doc, Machine, gb, per_token, times, tokens_cell
from attnbench.report.fit import ACCURACY_TARGET, MIN_TRIALS_FOR_TARGET
from attnbench.report.intervals import ratio_cell
from attnbench.report.markdown import Table
from attnbench.report.multigpu import STRATEGY_NAMES
from attnbench.units import format_tokens


def largest_records(m: Machine) -> list[dict[str, Any]]:
    records = []
    for s in sorted(m.summaries, key=lambda s: s["world_size"]):
        best = m.at_max(s)
        peak = d.peak_per_gpu(best) if best else None
        held = d.tokens(best) / s["world_size"] if best else None
        records.append(
            {
                "Implementation": s["label"],
                "GPUs": s["world_size"],
                "Device": s["device"],
                "Dtype": s["dtype"],
                "Mode": s["head"].get("mode") or "fwd",
                "Max Sequence": s["max_seq_len"] or None,
                "Stopped By": s["stopped_by"],
                "Peak Memory per GPU": peak,
                "Memory per Token": peak / held if peak and held else None,
                "Peak / Floor": best.get("peak_over_floor") if best else None,
            }
        )
    return records


def executive_summary(doc: Doc, m: Machine) -> None:
    records = largest_records(m)
    if not records:
        doc.missing("no max-seq search on this machine", "single")
    else:
        doc.add(
            "Largest sequence per implementation and GPU count (memory per token: the peak of one GPU over "
            "the tokens that GPU holds):\n"
        )
        doc.table(
            Table(
                "summary-largest",
                [
                    "Implementation",
                    "GPUs",
                    "Device",
                    "Dtype",
                    "Mode",
                    "Max Sequence",
                    "Stopped By",
                    "Peak Memory per GPU",
                    "Memory per Token",
                    "Peak / Floor",
                ],
                records,
                {
                    "Max Sequence": tokens_cell,
                    "Peak Memory per GPU": gb,
                    "Memory per Token": per_token,
                    "Peak / Floor": times,
                },
            )
        )
        bullets = []
        for p, device in sorted({(r["GPUs"], r["Device"]) for r in records}):
            top = max(
                (r for r in records if (r["GPUs"], r["Device"]) == (p, device) and r["Max Sequence"]),
                key=lambda r: r["Max Sequence"],
                default=None,
            )
            where = f"{p} GPU{'s' if p > 1 else ''}" if device == "cuda" else f"the {device}"
            if top:
                bullets.append(
                    f"- Longest sequence on {where}: **{format_tokens(top['Max Sequence'])}** "
                    f"tokens with {top['Implementation']} ({top['Dtype']}), stopped by {top['Stopped By']}."
                )
        ratios = [r for r in records if r["Peak / Floor"]]
        if ratios:
            lo, hi = min(ratios, key=lambda r: r["Peak / Floor"]), max(ratios, key=lambda r: r["Peak / Floor"])
            bullets.append(
                f"- Peak-to-floor ratio at the largest sequence: from {times(lo['Peak / Floor'])} "
                f"({lo['Implementation']}) to {times(hi['Peak / Floor'])} ({hi['Implementation']})."
            )
        doc.add("\n" + "\n".join(bullets) + "\n")
    # an efficiency above 1 beyond its interval is an anomaly to explain, never the headline
    best = max(
        (
            c
            for c in m.speedups
            if c["speedup"] and c["output_match"] is not False and not anomalous_efficiency(c["efficiency_ci"])
        ),
        key=lambda c: c["speedup"],
        default=None,
    )
    if best:
        doc.add(
            f"- Best speedup over one GPU: **{ratio_cell(best['speedup_ci'])}** ({STRATEGY_NAMES.get(best['strategy'], best['strategy'])}, "
            f"{best['world_size']} GPUs, {best['impl']}, N={best['seq_len']:,}, batch {best['batch']}; "
            f"efficiency {best['efficiency']:.2f}; {best['timer']} time).\n"
        )
    else:
        doc.add(
            f"- Best speedup over one GPU: no speedup rows on this machine; `{PRODUCERS['speedup']}` produces them.\n"
        )
    checked = [c for c in m.capacities if c.target_applies and c.error is not None]
    if checked:
        within = [c for c in checked if abs(c.error) <= ACCURACY_TARGET]
        doc.add(
            f"- Capacity prediction on this GPU: {len(within)} of {len(checked)} series with at least "
            f"{MIN_TRIALS_FOR_TARGET} successful trials predicted within {ACCURACY_TARGET:.0%} of the measured "
            "maximum (see Capacity prediction).\n"
        )
