"""A check's report as text (a terminal, a log), markdown (a pull-request comment) or JSON."""

from __future__ import annotations

import json
from collections import defaultdict

from attnbench.check.outcome import RSS_NOISE_BYTES, CheckReport, Thresholds
from attnbench.check.significance import MIN_PROCESSES, MIN_SAMPLES, NOT_GATED
from attnbench.errors import AttnbenchError
from attnbench.report.markdown import table
from attnbench.units import brief

FORMATS = ("text", "markdown", "json")
ORDER = ("regression", "improvement")
MARK = {
    "regression": "❌ regression",
    "improvement": "✅ improvement",
    NOT_GATED: "not gated",
    "unchanged": "unchanged",
}


def rules_text(t: Thresholds) -> str:
    bits = []
    if "time" in t.aspects:
        bits.append(
            f"time: beyond {t.time_factor_text()} and beyond the noise between the trial's own processes (the "
            "largest ratio between two of them on one side; a process's time is its median call on a GPU, its "
            "fastest call on a CPU, by CPU time where recorded, at one thread count); judged with at least "
            f"{MIN_PROCESSES} processes and {MIN_SAMPLES} samples per side"
        )
    if "memory" in t.aspects:
        bits.append(
            f"memory: peak beyond x{t.memory_factor:g} and beyond the spread between processes (on a CPU the "
            f"tensor bytes a call held, exact run to run; a resident set only with {MIN_PROCESSES} processes "
            f"a side, and beyond {RSS_NOISE_BYTES >> 20} MiB)"
        )
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
    not_gated = [f"{f.aspect} {f.trial} [{f.device_model}]: {f.evidence}" for f in report.of(NOT_GATED)]
    for title, items in (
        ("not gated (cannot be judged; not a regression)", not_gated),
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
        parts.append("No regression or improvement.\n")
    for verdict in (NOT_GATED, "unchanged"):
        found = report.of(verdict)
        if found:
            parts.append(
                f"\n<details><summary>{len(found)} {verdict}</summary>\n\n{table(head, rows(found))}\n</details>\n"
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
    raise AttnbenchError(f"--format {brief(fmt)}: choose text, markdown or json")
