"""A check's report as text (a terminal, a log), markdown (a pull-request comment) or JSON."""

from __future__ import annotations

import json
from collections import defaultdict

from attnbench.check.outcome import CheckReport, Thresholds
from attnbench.check.significance import MIN_SAMPLES
from attnbench.errors import AttnbenchError
from attnbench.report.markdown import table

FORMATS = ("text", "markdown", "json")
ORDER = ("regression", "inconclusive", "improvement")
MARK = {
    "regression": "❌ regression",
    "inconclusive": "⚠️ inconclusive",
    "improvement": "✅ improvement",
    "unchanged": "unchanged",
}


def rules_text(t: Thresholds) -> str:
    bits = []
    if "time" in t.aspects:
        bits.append(
            f"time: median beyond x{t.time_factor:g} and the bootstrap interval of the ratio excludes 1, "
            f"processes resampled as units, Holm-corrected p <= {t.alpha:g} across the comparisons "
            f"(at least {MIN_SAMPLES} samples per side)"
        )
    if "memory" in t.aspects:
        bits.append(f"memory: peak beyond x{t.memory_factor:g}")
    if "capacity" in t.aspects:
        bits.append(
            "capacity: lower max-seq (a time-limited one beyond one bisection step), or a trial that ran and now fails"
        )
    if "correctness" in t.aspects:
        bits.append("correctness: every reference check passes")
    if "bytes" in t.aspects:
        bits.append("bytes: floor and FLOP counts equal")
    if t.deterministic:
        bits.append("deterministic outputs only: CPU results compare across CPU models")
    return "; ".join(bits)


def render_text(report: CheckReport) -> str:
    lines = [f"attnbench check: {report.headline()}"]
    for side in (report.baseline, report.current):
        name = "baseline" if side is report.baseline else "current"
        lines.append(
            f"  {name:8}  {side['path']}  ({side['rows']} rows; {', '.join(side['device_models']) or 'reference checks only'})"
        )
    lines.append(f"  rules     {rules_text(report.thresholds)}")
    shown = [f for v in ORDER for f in report.of(v)]
    if shown:
        lines.append("")
    for f in shown:
        lines.append(
            f"{f.verdict.upper():12} {f.aspect:11} {f.trial} [{f.device_model}]: {f.baseline} -> {f.current}"
            f"{'  ' + f.change if f.change else ''}{'  (' + f.evidence + ')' if f.evidence else ''}"
        )
    counts = defaultdict(int)
    for f in report.of("unchanged"):
        counts[f.aspect] += 1
    if counts:
        lines.append("unchanged: " + ", ".join(f"{n} {a}" for a, n in counts.items()))
    for title, items in (
        ("added (current only)", report.added),
        ("missing (baseline only)", report.missing),
        ("not compared", report.not_compared),
    ):
        if items:
            lines.append(f"{title}: {len(items)}")
            lines += [f"  {x}" for x in items[:20]] + ([f"  ... and {len(items) - 20} more"] if len(items) > 20 else [])
    return "\n".join(lines) + "\n"


def render_markdown(report: CheckReport) -> str:
    icon = "❌" if report.exit_code else "✅"
    parts = [
        f"### {icon} attnbench check: {report.headline()}\n\n",
        f"Baseline `{report.baseline['path']}` ({', '.join(report.baseline['device_models']) or 'reference checks'}), "
        f"current `{report.current['path']}` ({', '.join(report.current['device_models']) or 'reference checks'}).  \n"
        f"Rules: {rules_text(report.thresholds)}.\n\n",
    ]
    head = ["Verdict", "Aspect", "Trial", "Device", "Baseline", "Current", "Change", "Evidence"]

    def rows(findings):
        return [
            [MARK[f.verdict], f.aspect, f.trial, f.device_model, f.baseline, f.current, f.change, f.evidence]
            for f in findings
        ]

    shown = [f for v in ORDER for f in report.of(v)]
    if shown:
        parts.append(table(head, rows(shown)))
    else:
        parts.append("No regression, improvement or inconclusive result.\n")
    unchanged = report.of("unchanged")
    if unchanged:
        parts.append(
            f"\n<details><summary>{len(unchanged)} unchanged</summary>\n\n{table(head, rows(unchanged))}\n</details>\n"
        )
    for title, items in (
        ("added (current only)", report.added),
        ("missing (baseline only)", report.missing),
        ("not compared", report.not_compared),
    ):
        if items:
            body = "\n".join(f"- {x}" for x in items)
            parts.append(f"\n<details><summary>{len(items)} {title}</summary>\n\n{body}\n\n</details>\n")
    return "".join(parts)


def render(report: CheckReport, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.to_json(), indent=2) + "\n"
    if fmt == "markdown":
        return render_markdown(report)
    if fmt == "text":
        return render_text(report)
    raise AttnbenchError(f"--format {fmt!r}: choose text, markdown or json")
