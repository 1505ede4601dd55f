"""The report's first screen: "Seed claims vs measured" (one row per claim of ``seed_claims.toml``)
and the findings per machine, as sentences with numbers."""

from __future__ import annotations

from typing import Any

from attnbench.report import claims as cl
from attnbench.report.markdown import Table
from attnbench.units import format_tokens

MAX_FINDINGS_PER_MACHINE = 6


def claim_records(vs: list[cl.Verdict]) -> list[dict[str, Any]]:
    return [
        {
            "Id": v.claim.id,
            "Claim": f"{v.claim.seed}: {v.claim.says}",
            "Seed": v.claim.seed_text,
            "Measured": cl.measured_text(v),
            "Verdict": v.verdict,
            "Why": v.why or "-",
            "Seed Workload": v.claim.workload,
        }
        for v in vs
    ]


def claims_table(doc, vs: list[cl.Verdict]) -> None:
    records = claim_records(vs)
    table = Table("seed-claims", ["Claim", "Seed", "Measured", "Verdict", "Why", "Id", "Seed Workload"], records)
    shown = Table("seed-claims", ["Claim", "Seed", "Measured", "Verdict", "Why"], records)
    doc.tables.append(("seed-claims.csv", table))
    doc.add(shown.markdown())
    doc.add(
        "\n<sub>Every claim of the five seed reports (2x GTX 1080, 8 GB), with the seed's workload, in "
        "`csv/seed-claims.csv`; the claims and the rule that picks their rows are "
        "`attnbench/report/seed_claims.toml`. Measured: value [first, third quartile] over n samples, on the "
        "newest matching row. " + cl.LEGEND + "</sub>\n"
    )


def tally(vs: list[cl.Verdict]) -> str:
    counts = {
        k: sum(v.verdict == k for v in vs) for k in (cl.CONFIRMED, cl.REFUTED, cl.NOT_COMPARABLE, cl.NOT_MEASURED)
    }
    two = sum(v.verdict == cl.NOT_MEASURED and v.why == "needs two GPUs" for v in vs)
    return (
        f"{len(vs)} seed claims: {counts[cl.CONFIRMED]} confirmed, {counts[cl.REFUTED]} refuted, "
        f"{counts[cl.NOT_COMPARABLE]} not comparable, {counts[cl.NOT_MEASURED]} not measured yet "
        f"({two} need two GPUs)."
    )


def claim_sentence(v: cl.Verdict) -> str:
    m = v.measured
    metric = "ratio" if v.claim.over is not None or v.claim.per else v.claim.metric
    why = v.why.split("; ")[0] if v.why else ""
    return (
        f"- Seed {v.claim.seed} said {v.claim.says}: {v.claim.seed_text}; measured "
        f"{cl.value_text(metric, m.value)} ({m.workload}): **{v.verdict}**" + (f", {why}." if why else ".")
    )


def machine_findings(machine, vs: list[cl.Verdict], largest: list[dict[str, Any]]) -> list[str]:
    lines = [f"**{machine.name}**"]
    for p in sorted({r["GPUs"] for r in largest}):
        top = max(
            (r for r in largest if r["GPUs"] == p and r["Max Sequence"]), key=lambda r: r["Max Sequence"], default=None
        )
        if top:
            lines.append(
                f"- Longest sequence on {p} GPU{'s' * (p > 1)}: {format_tokens(top['Max Sequence'])} tokens "
                f"({top['Implementation']}, {top['Dtype']}, {top['Mode']}), stopped by {top['Stopped By']}."
            )
    sane = [c for c in machine.speedups if c["speedup"] and c["output_match"] is not False]
    best = max((c for c in sane if (c["efficiency"] or 0) <= 1), key=lambda c: c["speedup"], default=None)
    if best:
        lines.append(
            f"- Best speedup over one GPU: {best['speedup']:.2f}x ({best['strategy']}, "
            f"{cl.short_label(best['row'])}, N={best['seq_len']:,}, batch {best['batch']})."
        )
    for c in sane:
        if (c["efficiency"] or 0) > 1:
            lines.append(
                f"- Anomaly: {c['speedup']:.2f}x with efficiency {c['efficiency']:.2f} above 1 "
                f"({c['strategy']}, {cl.short_label(c['row'])}, commit {str(c['row']['env']['commit'])[:9]}); "
                "not a finding."
            )
    mine = [
        v for v in vs if v.measured and v.measured.machine == machine.name and v.verdict in (cl.CONFIRMED, cl.REFUTED)
    ]
    lines += [claim_sentence(v) for v in mine[:MAX_FINDINGS_PER_MACHINE]]
    if len(mine) > MAX_FINDINGS_PER_MACHINE:
        lines.append(f"- {len(mine) - MAX_FINDINGS_PER_MACHINE} more verdicts from this machine in the table above.")
    return lines


def opening(doc, machines, largest_of) -> list[cl.Verdict]:
    """The table, then the findings; returns the verdicts for whoever needs them."""
    vs = cl.verdicts(machines)
    doc.heading(2, "Seed claims vs measured")
    doc.add(tally(vs) + "\n")
    claims_table(doc, vs)
    doc.heading(2, "Findings")
    for m in machines:
        doc.add("\n".join(machine_findings(m, vs, largest_of(m))) + "\n\n")
    return vs
