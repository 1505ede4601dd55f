"""The user's own implementations first: where a report's rows measured code from outside
attnbench (rows with ``impl_source``), it leads with that code, one row per configuration and
machine: where it came from (package and version, import path, a hash of its source), how its
pairs were counted, whether it was verified against the float64 reference, and how far it ran;
then every row whose FLOPs are unknown, with the reason. Reads rows only: the code is never
imported."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, distinct
from attnbench.report.markdown import Table, inline
from attnbench.report.tables.sweep import max_seq_text
from attnbench.results.schema import Trial
from attnbench.units import format_tokens

# How a row's pairs were obtained, in words (``pairs_counted``)
PAIRS_WORDS = {
    "closed-form": "closed form (dense)",
    "declared": "declared by the implementation",
    "blocks": "counted by tiles",
    "exact": "counted pair by pair",
    "unknown": "unknown",
}


@dataclass
class Own:
    """One outside configuration on one machine, as its rows say it."""

    machine: str
    label: str
    source: dict
    trials: list[Trial] = field(default_factory=list)
    longest: str = "-"

    @property
    def package(self) -> str:
        name, version = self.source.get("package"), self.source.get("version")
        return f"{name} {version}" if name else "not an installed package"

    @property
    def verified(self) -> str:
        said = {t.verified for t in self.trials}
        return "no" if False in said else ("yes" if True in said else "not recorded")

    @property
    def pairs(self) -> str:
        how = distinct(t.pairs_counted for t in self.trials if t.status == "ok")
        sources = distinct(t.pairs_source for t in self.trials if t.status == "ok")
        text = ", ".join(PAIRS_WORDS.get(h, h) for h in how) or "-"
        return text + (f" ({'; '.join(sources)})" if sources and "declared" in how else "")


def configurations(machines: list[Machine]) -> list[Own]:
    found: dict[tuple[str, str], Own] = {}
    for m in machines:
        summaries = {s.series: s for s in m.summaries}
        for t in m.trials:
            if not t.impl_source:
                continue
            own = found.setdefault((m.name, t.series), Own(m.name, t.label, t.impl_source))
            own.trials.append(t)
            if t.series in summaries:
                own.longest = max_seq_text(summaries[t.series])
            elif t.status == "ok":
                ran = max(x.seq_len for x in own.trials if x.status == "ok")
                own.longest = f"{format_tokens(ran)} (fixed lengths)"
    return list(found.values())


def render(doc: Doc, machines: list[Machine]) -> None:
    """The section, where the rows measured outside code; nothing otherwise."""
    owns = configurations(machines)
    if not owns:
        return
    doc.heading(2, "Your implementations")
    unverified = any(o.verified == "no" for o in owns)
    doc.add(
        "Code from outside attnbench, as its rows recorded it: the package and version, the import path and the\n"
        "SHA-256 of its source (the same hash: the same code), how its pairs (so FLOPs) were obtained, and\n"
        "whether it passed the float64 reference check first"
        + (f" (`{d.UNVERIFIED.strip()}` marks it in every table where not).\n" if unverified else ".\n")
    )
    columns = {
        "Configuration": "label",
        "Machine": "machine",
        "Package": "package",
        "Import Path": lambda o: o.source.get("import_path"),
        "Source SHA-256": lambda o: o.source.get("source_sha256") or "-",
        "Pairs": "pairs",
        "Verified": "verified",
        "Longest": "longest",
    }
    doc.table(Table.of("own-implementations", columns, owns))
    unknown = [(o, t) for o in owns for t in o.trials if t.status == "ok" and t.flops_unknown]
    if unknown:
        doc.add("\nFLOPs unknown (time and memory as measured):\n")
        seen: dict[tuple[str, str], list[int]] = {}
        for o, t in unknown:
            seen.setdefault((o.label, t.flops_unknown), []).append(t.seq_len)
        for (label, why), lengths in seen.items():
            at = ", ".join(format_tokens(n) for n in sorted(set(lengths)))
            doc.add(f"- {inline(label)} at {at}: {inline(why)}\n")
