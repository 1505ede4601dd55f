"""`attnbench report`: read result files, write ``report.md``, CSV tables and PNG plots.

Rows are grouped by the machine that measured them (``env.machine``); every section shows
each machine apart, so numbers from different hardware are never combined. Everything is
computed in memory first and written only when it all succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnbench.report import plots as p
from attnbench.report.data import Results, load, slug
from attnbench.report.document import Doc, Machine
from attnbench.report.findings import opening
from attnbench.report.sections import SECTIONS
from attnbench.report.sections.summary import largest_records
from attnbench.report.sweep_tables import max_seq_summary, trials_csv
from attnbench.results import check_output_dir, now_utc, write_text_atomic

REPORT_FILE = "report.md"
CSV_DIR = "csv"


@dataclass
class Written:
    report: Path
    files: list[Path]
    problems: list[str]
    machines: list[str]


def default_out(results: Path) -> Path:
    results = Path(results)
    return (results.parent if results.is_file() else results) / "report"


def render(results: Results) -> Doc:
    """The whole report in memory: markdown, tables and figures."""
    machines = [Machine(name, rows) for name, rows in results.by_machine.items()]
    doc = Doc()
    runs = sorted({str(r.get("run")) for r in results.rows if r.get("run")})
    doc.add("# attnbench report\n")
    doc.add(
        f"Generated {now_utc()} by `attnbench report {results.source}` from {len(results.rows)} rows in "
        f"{len(results.files)} result files ({len(runs)} runs, listed in the appendix). Nothing here ran a benchmark: "
        "every number is read or derived from those rows, grouped by the machine that measured them "
        "(never combined across machines). Tables hold raw values in `csv/` (times in ms, memory in bytes, "
        "throughput in tokens/s). GB = 10^9 bytes, GiB = 2^30.\n"
    )
    doc.add("\nMachines: " + "; ".join(f"**{m.name}** ({len(m.rows)} rows)" for m in machines) + "\n")
    opening(doc, machines, largest_records)
    if results.problems:
        doc.add(
            f"\n{len(results.problems)} unreadable lines were skipped:\n\n"
            + "".join(f"- `{line}`\n" for line in results.problems)
        )
    for title, seed, section in SECTIONS:
        doc.heading(2, title)
        if seed:
            doc.add(f"Regenerates the tables of seed report `{seed}` (see docs/semantics.md) from measurements.\n")
        without: dict[str, list[str]] = {}  # a "no data" line -> machines that only have that to say
        for m in machines:
            part = Doc()
            part.machine_slug, part.tables, part.figures = (
                m.slug,
                doc.tables,
                doc.figures,
            )  # shared: CSV names stay unique
            before = (len(doc.tables), len(doc.figures))
            section(part, m)
            missing = only_missing(part, before != (len(doc.tables), len(doc.figures)))
            if missing is None:
                doc.heading(3, f"{m.name}")
                doc.parts += part.parts
            else:
                without.setdefault(missing, []).append(m.name)
        for lines, names in without.items():
            doc.add(f"\nNot on {', '.join(names)}:\n\n{lines}")
    doc.add(f"\nRuns: {', '.join(runs) or '-'}.\n")
    return doc


def only_missing(part: Doc, produced: bool) -> str | None:
    """The "no data" lines of a machine that cannot produce a section, else None (show it)."""
    said = [p for p in part.parts if p.strip() and not p.lstrip().startswith("#")]
    if produced or not said or not all(p.startswith("_No data:") for p in said):
        return None
    return "".join(dict.fromkeys(said))


def write_report(results_path: Path, out: Path | None = None) -> Written:
    out_dir = Path(out) if out else default_out(results_path)
    check_output_dir(out_dir)  # before reading anything
    results = load(results_path)
    doc = render(results)
    written = []
    for name, table in doc.tables:
        path = out_dir / CSV_DIR / name
        write_text_atomic(path, table.csv())
        written.append(path)
    for name, rows in results.by_machine.items():
        if any(r.get("kind") in ("max-seq", "points") for r in rows):
            path = out_dir / CSV_DIR / f"trials-{slug(name)}.csv"
            write_text_atomic(path, trials_csv(rows))
            written.append(path)
        summary = max_seq_summary(rows)
        if summary:
            import pandas as pd

            path = out_dir / CSV_DIR / f"max-seq-{slug(name)}.csv"
            write_text_atomic(path, pd.DataFrame(summary).to_csv(index=False))
            written.append(path)
    for name, fig in doc.figures:
        p.save(fig, out_dir / name)
        written.append(out_dir / name)
    report = out_dir / REPORT_FILE
    write_text_atomic(report, doc.text())
    return Written(report, [report, *written], results.problems, list(results.by_machine))
