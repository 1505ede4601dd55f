"""The files a results directory gets beside its trials.jsonl, rewritten after every sweep:
``sweep.md``, the report's own sections for the directory's rows alone (``attnbench report``
adds the answer, the seed reports' claims and the figures), and the rows as CSV
(``trials.csv``, ``max_seq.csv``, ``speedup.csv``, ``speedup_memory.csv``; raw values, the
labels as written)."""

from __future__ import annotations

from pathlib import Path

from attnbench.report.build import details, machine_order
from attnbench.report.data import Results, load, speedup_rows, trials
from attnbench.report.document import Doc
from attnbench.report.markdown import inline
from attnbench.report.tables.speedup import memory_csv, speedup_csv
from attnbench.report.tables.sweep import max_seq_csv, max_seq_summary, trials_csv
from attnbench.results import load_rows, write_text_atomic
from attnbench.results.schema import Row

RUN_MARKDOWN = "sweep.md"


def run_markdown(results: Results) -> str:
    """The report's sections for one results directory: every table, no CSV links, no figures."""
    runs = sorted({r.run for r in results.rows if r.run})
    doc = Doc()
    doc.run_file = True
    doc.add(f"# attnbench: {', '.join(inline(r) for r in runs) or inline(results.source)}\n")
    doc.add(
        f"The tables of `attnbench report {inline(results.source)}` for these rows alone; that command adds the "
        "answer first, the seed reports' claims held against the rows, plots, and every table as CSV.\n"
    )
    details(doc, machine_order(results))
    return doc.text()


def write_run_files(out_dir: Path, loaded: tuple[list[Row], list[str]] | None = None) -> list[Path]:
    """Regenerate a results directory's markdown and CSV files from its ``trials.jsonl``
    (``loaded``: what ``load_rows`` read of it already)."""
    out_dir = Path(out_dir)
    loaded = loaded or load_rows(out_dir)
    rows = loaded[0]
    if not rows:
        return []
    files = {RUN_MARKDOWN: run_markdown(load(out_dir, loaded))}
    if trials(rows):
        files["trials.csv"] = trials_csv(rows)
    summary = max_seq_summary(rows)
    if summary:
        files["max_seq.csv"] = max_seq_csv(summary)
    if speedup_rows(rows):
        files |= {"speedup.csv": speedup_csv(rows), "speedup_memory.csv": memory_csv(rows)}
    for name, text in files.items():
        write_text_atomic(out_dir / name, text)
    return [out_dir / name for name in files]
