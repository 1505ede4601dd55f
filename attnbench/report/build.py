"""`attnbench report`: read result files, write ``report.md`` and ``seeds.md``, CSV tables and PNG plots.

The report answers first: per machine, one row per configuration (``report.answer``), then how
the seed reports fare against the rows (``report.seeds``), then one figure. The detailed
sections follow (``report.sections``), each machine apart, so numbers from different hardware
are never combined. Everything is computed in memory first and written only when it all
succeeded; the same rows give the same bytes, but for the one line that says when.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnbench.errors import AttnbenchError
from attnbench.report import answer as a
from attnbench.report import own
from attnbench.report.data import Results, load, slug
from attnbench.report.document import Doc, Machine
from attnbench.report.markdown import Table, inline
from attnbench.report.plots import figures as p
from attnbench.report.plots.drawing import Drawing
from attnbench.report.sections import sections
from attnbench.report.seeds import page as sd
from attnbench.report.seeds.verdicts import CONFIRMED, DIRECTION_ONLY, INCONCLUSIVE, REFUTED, verdicts
from attnbench.report.tables.sweep import max_seq_csv, max_seq_summary, trials_csv
from attnbench.results import check_output_dir, now_utc, utf8, write_files_whole
from attnbench.results.read import distinct_paths
from attnbench.results.series import SUPERSEDED_FILE

REPORT_FILE = "report.md"
# Verdicts only a measurement of a seed's workload gives: without one the seeds' pages are left out.
MEASURED_VERDICTS = (CONFIRMED, DIRECTION_ONLY, REFUTED, INCONCLUSIVE)
CSV_DIR = "csv"
ANSWER_FIGURE = "answer.png"


@dataclass
class Written:
    report: Path
    files: list[Path]
    problems: list[str]
    machines: list[str]


def default_out(sources: tuple[Path, ...]) -> Path:
    """RESULTS/report for one results path; several have no one place: --out names it."""
    if len(sources) > 1:
        raise AttnbenchError("several results paths have no one default report directory: name it with --out DIR")
    results = sources[0]
    return (results.parent if results.is_file() else results) / "report"


def machine_order(results: Results) -> list[Machine]:
    """GPU machines first, the one with most rows first; CPU machines last."""
    named = sorted(results.by_machine.items(), key=lambda kv: (kv[0].startswith("cpu"), -len(kv[1]), kv[0]))
    return [Machine(name, rows) for name, rows in named]


# figures a machine may have (the plots section's memory, time, TFLOP/s and speedup), and the answer's
FIGURES_PER_MACHINE = 4


def render(results: Results) -> Doc:
    """The whole report in memory: markdown, tables and figures (drawn meanwhile where there
    are many: ``Drawing``)."""
    machines = machine_order(results)
    doc = Doc(Drawing(expected=FIGURES_PER_MACHINE * len(machines) + 1))
    try:
        _compose(doc, results, machines)
        doc.drawing.finish(doc.figures)
    finally:
        doc.drawing.close()
    return doc


def _compose(doc: Doc, results: Results, machines: list[Machine]) -> None:
    runs = sorted({r.run for r in results.rows if r.run})
    vs = verdicts(machines)
    seeds = any(v.verdict in MEASURED_VERDICTS for v in vs)  # a run measured a seed workload
    doc.add("# attnbench report\n")
    doc.add(
        f"Generated {now_utc()} by `attnbench report {inline(results.source)}`.\n"
        + (
            f"The seed reports' claims, each held against these rows: [{sd.SEEDS_FILE}]({sd.SEEDS_FILE}).\n"
            if seeds
            else ""
        )
    )
    answer(doc, machines)  # the user's own implementations lead its rows
    # the seeds ran on GPUs: after the answer where a GPU ran too, after the details for a CPU run
    gpu_ran = not all(m.on_cpu for m in machines)
    if gpu_ran and seeds:
        against_the_seeds(doc, machines, vs)
    figure = p.answer_plot([(m.name, [c for c in a.configurations(m) if c.searched]) for m in machines])
    if figure is not None:
        doc.figures.append((ANSWER_FIGURE, doc.drawing.png(figure)))
        doc.add(f"\n![longest sequence per configuration and machine]({ANSWER_FIGURE})\n")
    doc.add(
        f"\nFrom {len(results.rows)} rows in {len(results.files)} result file{'s' * (len(results.files) != 1)} "
        f"({len(runs)} run{'s' * (len(runs) != 1)}, listed in the appendix);\nthe report runs nothing itself, and each machine's rows stay apart. Tables hold raw values "
        "in `csv/`\n(times in ms, memory in bytes). Memory is in binary units: KiB = 2^10 bytes, MiB = 2^20, "
        "GiB = 2^30.\nDetails by question follow.\n"
    )
    # then where their code came from, how their pairs were counted, whether they were verified
    own.render(doc, machines)
    if results.problems:
        doc.add(
            f"\n{len(results.problems)} unreadable lines were skipped:\n\n"
            + "".join(f"- `{inline(line)}`\n" for line in results.problems)
        )
    details(doc, machines)
    if not gpu_ran and seeds:
        against_the_seeds(doc, machines, vs)
    superseded(doc, results)
    doc.add(f"\nRuns: {', '.join(inline(r) for r in runs) or '-'}.\n")


def superseded(doc: Doc, results: Results) -> None:
    """The runs newer ones replaced: kept in the results, named here, used nowhere above."""
    if not results.retired:
        return
    doc.heading(2, "Superseded runs (appendix)")
    doc.add(
        f"Their rows stay in the results but not in any answer, section or verdict above (`{SUPERSEDED_FILE}` "
        "names each run, the run that replaced it and why).\n"
    )
    columns = {
        "Run": "run",
        "Machine": lambda r: ", ".join(r.machines),
        "Rows": "rows",
        "Superseded by": "by",
        "Why": "why",
    }
    doc.table(Table.of("superseded", columns, results.retired))


def against_the_seeds(doc: Doc, machines: list[Machine], vs=None) -> None:
    """The seed reports' claims held against the rows: a summary here, each claim in seeds.md."""
    vs = verdicts(machines) if vs is None else vs
    doc.heading(2, "Against the seeds")
    doc.add(sd.summary(vs))
    doc.tables.append(("seed-claims.csv", sd.csv_table(vs)))
    doc.files[sd.SEEDS_FILE] = sd.seeds_markdown(vs)


# The answer for every machine fits in the first screen of a terminal, this many lines.
FIRST_SCREEN_LINES = 40


def answer(doc: Doc, machines: list[Machine]) -> None:
    """The first screen: per machine, the answer table."""
    doc.heading(2, "The answer: how long, how fast, how much memory")
    doc.add(
        "Per configuration, its newest search: the longest length that ran – the shortest that failed (≥: not\n"
        "finished), memory per token and peak over the floor (q, k, v, output) there; where not every row ran\n"
        "at "
        f"{a.REFERENCE_TEXT}, the time of one forward call at the longest length every row ran; useful TFLOP/s at "
        f"{a.REFERENCE_TEXT}\nwhere a trial ran there; ±half the 95% interval (n). A column no row fills is left out.\n"
    )
    every = [a.configurations(m) for m in machines]
    if any(c.searched for configs in every for c in configs):  # searches answer; a bench-only report, speed
        every = [[c for c in configs if c.searched] for configs in every]
    helps = second_gpu(machines)
    used = len(doc.text().splitlines()) + 1  # and the blank line before the first machine
    framing = sum(3 if configs else 2 for configs in every)  # a heading, and a table's header and rule
    framing += len(helps.splitlines())
    shown = a.first_screen(every, FIRST_SCREEN_LINES - used - framing)
    for i, (m, configs, rows) in enumerate(zip(machines, every, shown)):
        # no blank line between tables: a heading ends the table above it, and the first screen stays short
        # a machine without a search answers with speed and memory at one length, and says so
        unsearched = (
            "; no max-seq search: speed and memory at one length" if not any(c.searched for c in configs) else ""
        )
        doc.add(f"{'' if i else chr(10)}### {inline(m.name)} ({a.machine_words(m)}{unsearched if configs else ''})\n")
        if not configs:
            doc.add(
                f"No max-seq search on this machine: `attnbench run --profile auto` runs one ({len(m.rows)} rows).\n"
            )
            continue
        doc.add(a.answer_table(configs, rows).markdown())
        if len(rows) < len(configs):
            more = len(configs) - len(rows)
            doc.add(
                f"{more} more configuration{'s' * (more > 1)} of this machine in "
                f"[How long](#how-long-every-max-seq-search) and `csv/answer-{m.slug}.csv`.\n"
            )
        doc.tables.append((f"answer-{m.slug}.csv", Table.of("answer", a.CSV_COLUMNS, configs)))
    if helps:
        doc.add(f"\n#### Does adding GPUs help?\n{helps}")


def second_gpu(machines: list[Machine]) -> str:
    """The machines of several GPUs: their sequence-parallel and data-parallel answers, two short
    tables with a row per machine and implementation, so machines read side by side."""
    from attnbench.report.seeds.page import machine_short
    from attnbench.report.tables import second_gpu as sg

    several = [(machine_short(m.name), m) for m in machines if m.several_gpus]
    parts = []
    seq = sg.merged([(name, sg.sequence_parallel(m.rows, m.gpu_count)) for name, m in several])
    if seq:
        parts.append(wrapped(sg.SEQUENCE_TEXT) + seq.markdown())
        if not any(r.get("At") for r in seq.records):
            parts.append(wrapped(sg.NO_EQUAL_WORK))
    batch = sg.merged([(name, sg.data_parallel(m.speedups)) for name, m in several])
    if batch:
        parts.append(wrapped(sg.BATCH_TEXT) + batch.markdown())
    return "".join(parts)


def wrapped(text: str) -> str:
    """Prose on the first screen, in lines a terminal shows whole."""
    import textwrap

    return textwrap.fill(text, 110, break_on_hyphens=False) + "\n"


def details(doc: Doc, machines: list[Machine]) -> None:
    """Every section with rows, each machine's part under it; machines a section has nothing
    for are named once, with the command that produces what is missing; a section no machine
    has rows for is only named, in a closing list with that command. A results directory's own
    file (``doc.run_file``) leaves out the report-only sections and what its run did not measure."""
    unmeasured: list[str] = []
    for section in sections():
        if doc.run_file and section.report_only:
            continue
        body = Doc()
        without: dict[str, list[str]] = {}  # a "no data" text -> machines that only have that to say
        for m in machines:
            part = doc.part(m)
            before = (len(doc.tables), len(doc.figures))
            section.render(part, m)
            missing = only_missing(part, before != (len(doc.tables), len(doc.figures)))
            if missing is None:
                body.heading(3, m.name)
                body.parts += part.parts
            elif missing and not doc.run_file:
                without.setdefault(missing, []).append(m.name)
        said = [f"{lines.strip()} (on {', '.join(inline(n) for n in names)})" for lines, names in without.items()]
        if not body.parts:  # no machine has rows for it: named at the end, never a section of its own
            unmeasured += [f"- {section.title}: {line}\n" for line in said]
            continue
        for lines, names in without.items():
            body.add(f"\nNot measured on {', '.join(inline(n) for n in names)}:\n\n{lines}")
        doc.heading(2, section.title)
        doc.parts += body.parts
    if unmeasured:
        doc.heading(2, "Not measured here")
        doc.add("What no machine above has rows for, and the command that produces each:\n\n" + "".join(unmeasured))


def only_missing(part: Doc, produced: bool) -> str | None:
    """None where a machine's part has something to show; else its "no data" lines ("" when it
    says nothing at all: a section with nothing for this kind of machine)."""
    said = [x for x in part.parts if x.strip() and not x.lstrip().startswith("#")]
    if produced or not all(x.startswith("_No data:") for x in said):
        return None
    return "".join(dict.fromkeys(said))


def write_report(paths: Path | Sequence[Path], out: Path | None = None) -> Written:
    """The report of the rows under the results ``paths`` in ``out`` (default RESULTS/report for one path),
    replacing the files of a report written there before, and only those, as one set: a
    write that fails leaves the previous report as it was."""
    sources = distinct_paths(paths)
    out_dir = Path(out) if out else default_out(sources)
    check_output_dir(out_dir)  # before reading anything
    results = load(sources)
    doc = render(results)
    files = {f"{CSV_DIR}/{name}": table.csv() for name, table in doc.tables}
    for name, rows in results.by_machine.items():
        if any(r.kind in ("max-seq", "points") for r in rows):
            files[f"{CSV_DIR}/trials-{slug(name)}.csv"] = trials_csv(rows)
        summary = max_seq_summary(rows)
        if summary:
            files[f"{CSV_DIR}/max-seq-{slug(name)}.csv"] = max_seq_csv(summary)
    files.update(doc.files)
    files[REPORT_FILE] = doc.text()
    data = {name: utf8(text) for name, text in files.items()} | dict(doc.figures)
    written = write_files_whole(out_dir, data)
    problems = list(results.problems)
    if doc.drawing.missing_glyphs:
        problems.append(
            f"the figures' font has no glyph for {', '.join(sorted(doc.drawing.missing_glyphs))} (from labels): "
            "they show as boxes"
        )
    report = out_dir / REPORT_FILE
    return Written(report, [report, *(w for w in written if w != report)], problems, list(results.by_machine))
