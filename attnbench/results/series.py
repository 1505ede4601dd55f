"""Which rows form one series across runs and results directories, as every reader of rows
sees them (the report, ``attnbench.load``): runs a newer run replaced are retired
(``superseded.toml``), a series measured by several versions of the code or under several
allocator limits is several series, and the machine, commit and date a row names."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnbench.errors import AttnbenchError
from attnbench.results.convert import replaced
from attnbench.results.schema import MaxSeqResult, Row, Trial
from attnbench.units import format_gib

UNKNOWN_MACHINE = "unknown machine"


@dataclass(frozen=True)
class Retired:
    """A run whose rows a newer run replaced: kept and listed, never in an answer, section or verdict."""

    run: str
    by: str  # the run that replaced it
    why: str
    machines: tuple[str, ...]
    rows: int


# Beside the result files: the runs newer ones replaced, each with the run that did and why
# (``[[run]]`` tables of ``run``, ``by``, ``why``).
SUPERSEDED_FILE = "superseded.toml"


def read_superseded(path: Path) -> dict[str, tuple[str, str]]:
    """run -> (by, why) from ``path/superseded.toml``; none where the file is absent."""
    import tomllib

    file = Path(path) / SUPERSEDED_FILE
    if not file.is_file():
        return {}
    try:
        tables = tomllib.loads(file.read_text()).get("run", [])
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AttnbenchError(f"{file}: not valid TOML ({exc}); fix it or remove it") from None
    out = {}
    for i, t in enumerate(tables if isinstance(tables, list) else [None], 1):
        if not isinstance(t, dict) or set(t) != {"run", "by", "why"} or not all(isinstance(v, str) for v in t.values()):
            raise AttnbenchError(f"{file}: [[run]] {i} must hold exactly run, by and why, each a string")
        out[t["run"]] = (t["by"], t["why"])
    return out


def retire(rows: list[Row], superseded: dict[str, tuple[str, str]]) -> tuple[list[Row], list[Retired]]:
    """The rows still standing, and each superseded run that has rows here."""
    live = [r for r in rows if r.run not in superseded]
    gone: dict[str, list[Row]] = {}
    for r in rows:
        if r.run in superseded:
            gone.setdefault(r.run, []).append(r)
    retired = [
        Retired(run, *superseded[run], tuple(sorted({machine_of(r) for r in rs})), len(rs))
        for run, rs in sorted(gone.items())
    ]
    return live, retired


def machine_of(row: Row) -> str:
    return (row.env.machine if row.env else None) or UNKNOWN_MACHINE


def has_label(row: Row) -> bool:
    return isinstance(row, (Trial, MaxSeqResult)) and bool(row.label)


def relabel(row: Row, label: str, series: str | None = None) -> Row:
    """The row with another label (and series key); rows are never changed in place."""
    return replaced(row, label=label) if series is None else replaced(row, label=label, series=series)


def short_commit(row: Row) -> str:
    commit = str((row.env.commit if row.env else None) or "unknown")
    head, _, dirty = commit.partition("-")
    return head[:9] + (f"-{dirty}" if dirty else "")


def row_date(row: Row) -> str:
    return str((row.env.date if row.env else None) or "")


def separate_memory_limits(rows: list[Row]) -> list[Row]:
    """A configuration swept both on the whole GPU and under an allocator limit
    (``memory_limit``), or under two limits, is one series per limit, each limited one
    labelled with its limit: a capacity under a limit is the limit's, not the GPU's, and never
    pools with or supersedes another. Trials carry the limit; the run's other rows of that
    series (its max-seq result) follow them."""
    limits = {(r.run, r.series): r.memory_limit for r in rows if isinstance(r, Trial)}
    per_series: dict[str, set] = {}
    for (_, series), limit in limits.items():
        per_series.setdefault(series, set()).add(limit)
    mixed = {series for series, seen in per_series.items() if len(seen) > 1}

    def rekey(r: Row) -> Row:
        if not has_label(r) or r.series not in mixed or not limits.get((r.run, r.series)):
            return r
        limit = limits[(r.run, r.series)]
        return relabel(r, f"{r.label or r.impl} under {format_gib(limit)}", f"{r.series}~{limit}")

    return [rekey(r) for r in rows] if mixed else rows


def separate_code_versions(rows: list[Row]) -> list[Row]:
    """A series measured by several versions of the code is several series: trials of
    different code never pool into one search, one table or one fit (a before-and-after
    pair in one results tree stays a pair). Rows of such a series get the commit in their
    series key and label; series measured by one commit keep theirs."""
    commits: dict[tuple[str, str], dict[str, str]] = {}  # series -> commit -> its newest row's date
    for r in rows:
        if has_label(r):
            dates = commits.setdefault((machine_of(r), r.series), {})
            dates[short_commit(r)] = max(dates.get(short_commit(r), ""), row_date(r))
    split = {key: superseded_by(dates) for key, dates in commits.items() if len(dates) > 1}
    if not split:
        return rows

    def version(r: Row) -> Row:
        if not has_label(r) or (machine_of(r), r.series) not in split:
            return r
        newest, mine = split[(machine_of(r), r.series)], short_commit(r)
        later = f" (superseded by {newest})" if newest and newest != mine else ""
        return relabel(r, f"{r.label or r.impl} @ {mine}{later}", f"{r.series}@{mine}")

    return [version(r) for r in rows]


def superseded_by(dates: dict[str, str]) -> str | None:
    """The commit whose rows are strictly the newest: it supersedes the series' other commits."""
    ranked = sorted(dates.items(), key=lambda kv: (kv[1], kv[0]))
    return ranked[-1][0] if ranked[-1][1] > ranked[-2][1] else None


def is_superseded(label: str | None) -> bool:
    """A series whose code a newer commit replaced (``separate_code_versions`` says so in its label)."""
    return "(superseded by " in (label or "")
