"""The seed reports held against the measurements: ``seeds.md`` (every claim, by seed report, with
its verdict and a short reason), the CSV behind it, and the short summary the report's first
screen carries (the verdict counts and the findings that matter most)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from typing import Any

from attnbench.report.markdown import Table, inline
from attnbench.report.seeds import verdicts as v
from attnbench.report.seeds.claims import LEGEND, Previous, Seed, load_previous, load_seeds, value_text

SEEDS_FILE = "seeds.md"
HARDWARE = "two NVIDIA GeForce GTX 1080 (Pascal, 8 GB each)"
SEED_TITLES = {
    "000": "Block-sparse multi-GPU analysis",
    "001": "Multi-GPU capabilities",
    "002": "Extreme sequence length",
    "003": "Dilated configurations and multi-GPU scaling",
    "004": "Ring attention, one GPU against two",
}
FINDINGS = 3
WRAP = 110  # columns of a finding's lines


def machine_short(name: str) -> str:
    """'NVIDIA H200 x1' -> 'H200 x1', 'cpu: AMD EPYC' -> 'CPU (AMD EPYC)'."""
    if name.startswith("cpu: "):
        return f"CPU ({name[5:]})"
    return name.removeprefix("NVIDIA ")


def measured_text(verdict: v.Verdict) -> str:
    m = verdict.measured
    if m is None:
        return "-"
    metric = "ratio" if verdict.claim.over is not None or verdict.claim.per else verdict.claim.metric
    text = ("≥ " if m.bound else "") + value_text(metric, m.value)
    if m.low is not None and m.high is not None:
        text += f" [{value_text(metric, m.low)}, {value_text(metric, m.high)}]"
    return f"{text} n={m.n}"


def why_text(verdict: v.Verdict) -> str:
    """The verdict's reason, then how the rows stand in for the seed's workload, then how the
    number was measured."""
    bits = [verdict.why]
    if verdict.claim.note and verdict.claim.comparable:
        bits.append(verdict.claim.note)
    if verdict.measured:
        bits += verdict.measured.notes
    return "; ".join(b for b in bits if b)


# The CSV's columns, each a verdict's cell; seeds.md shows PAGE_COLUMNS of them.
COLUMNS: dict[str, Callable[[v.Verdict], Any]] = {
    "Id": lambda x: x.claim.id,
    "Seed": lambda x: x.claim.seed,
    "Claim": lambda x: x.claim.says,
    "Seed Says": lambda x: x.claim.seed_text,
    "Measured": measured_text,
    "On": lambda x: f"{machine_short(x.measured.machine)}: {x.measured.workload}" if x.measured else None,
    "Verdict": lambda x: x.verdict,
    "Why": why_text,
    "Measured Value": lambda x: x.measured.value if x.measured else None,
    "Seed Value": lambda x: x.claim.seed_value,
    "Seed Workload": lambda x: x.claim.workload,
    "Rows": lambda x: " ".join(s for s in (x.measured.sources if x.measured else []) if s) or None,
}
PAGE_COLUMNS = ("Claim", "Seed Says", "Measured", "On", "Verdict", "Why")


def csv_table(vs: list[v.Verdict]) -> Table:
    return Table.of("seed-claims", COLUMNS, vs)


def counts(vs: list[v.Verdict]) -> dict[str, int]:
    return {name: sum(x.verdict == name for x in vs) for name in v.VERDICTS}


def tally(vs: list[v.Verdict]) -> str:
    """'105 claims: 20 confirmed, ... (5 need two GPUs)'."""
    c = counts(vs)
    parts = [f"{n} {name}" for name, n in c.items() if n]
    two = sum(x.verdict == v.NOT_MEASURED and x.claim.where == "two GPUs" for x in vs)
    return f"{len(vs)} claims: {'; '.join(parts)}" + (f" ({two} need two GPUs)" if two else "") + "."


def findings(vs: list[v.Verdict], k: int = FINDINGS) -> list[v.Verdict]:
    """The findings a reader of the seeds most needs corrected: refutations of what a seed put in
    its summary or conclusion, measured on its terms (``headline``), the largest factor first,
    one per seed report."""
    wrong = [x for x in vs if is_finding(x)]
    ranked = sorted(wrong, key=lambda x: (-abs(math.log(x.ratio)), x.claim.id))
    out, seeds = [], set()
    for x in ranked:
        if x.claim.seed not in seeds:
            out.append(x)
            seeds.add(x.claim.seed)
        if len(out) == k:
            break
    return out


def is_finding(x: v.Verdict) -> bool:
    """A finding fit for the first screen: a seed's headline refuted by a GPU's measurement. A
    fit, a ring that sent nothing and a CPU's stand-in never get that far: the rule leaves them
    without a refutation (``verdicts.unsettled``), and the seeds measured GPUs."""
    m = x.measured
    return (
        x.claim.headline
        and x.verdict in (v.REFUTED, v.DIRECTION_ONLY)
        and m is not None
        and m.device == "cuda"
        and v.unsettled(m) is None
        and bool(x.ratio and x.ratio > 0)
    )


def finding_line(x: v.Verdict) -> str:
    m = x.measured
    metric = "ratio" if x.claim.over is not None or x.claim.per else x.claim.metric
    measured = ("at least " if m.bound else "") + value_text(metric, m.value)
    said = f"- Seed {x.claim.seed} said {x.claim.seed_text}: {inline(x.claim.says)}."
    found = f"Measured {measured}: **{x.verdict}**, {x.why}."
    # wrapped: the reason names both sides' hardware, too long for one line of the first screen
    return said + "\n" + textwrap.fill(found, WRAP, initial_indent="  ", subsequent_indent="  ", break_long_words=False)


def summary(vs: list[v.Verdict]) -> str:
    """The report's "against the seeds" part: counts, the findings that matter most, the link."""
    lines = [
        f"Five seed reports measured on {HARDWARE}; each claim is held against these rows",
        f"by one rule (docs/design/verdicts.md), claim by claim in [{SEEDS_FILE}]({SEEDS_FILE}).",
        tally(vs),
    ]
    moved = changed(vs, load_previous())
    if moved:
        lines.append(f"{len(moved)} verdicts differ from the previous rule's ({SEEDS_FILE} lists them).")
    furthest = findings(vs)
    if furthest:
        lines += [
            "",
            "What the seeds said that the measurements refute most:",
            "",
            *(finding_line(x) for x in furthest),
        ]
    return "\n".join(lines) + "\n"


def changed(vs: list[v.Verdict], previous: Previous | None) -> list[tuple[v.Verdict, str]]:
    """The verdicts that differ from the previous rule's, each with the verdict it had."""
    if previous is None:
        return []
    was = previous.verdict
    return [(x, was[x.claim.id]) for x in vs if x.claim.id in was and was[x.claim.id] != x.verdict]


def changed_text(vs: list[v.Verdict], previous: Previous | None) -> str:
    """'33 of 107 verdicts differ from rule v2's ...: - id: was -> now' (nothing without a record)."""
    moved = changed(vs, previous)
    if previous is None:
        return ""
    head = f"{len(moved)} of {len(vs)} verdicts differ from those of the previous rule ({previous.rule})"
    if not moved:
        return head + ".\n"
    lines = [f"- {x.claim.id}: {was} -> **{x.verdict}**" for x, was in moved]
    return head + ":\n\n" + "\n".join(lines) + "\n"


def seed_line(seed: Seed | None) -> str:
    """A seed section's settings, stated once: the dtype every claim of it is judged in."""
    if seed is None:
        return ""
    shape = "" if seed.shape_stated else " It states no heads or head dim: its memory is also read over the floor."
    return f"Every claim judged in {seed.dtype}: {seed.why}.{shape}\n\n"


def seeds_markdown(vs: list[v.Verdict], previous: Previous | None = None, seeds: dict[str, Seed] | None = None) -> str:
    """seeds.md: the rule in brief, what changed since the previous rule, then every claim by seed report."""
    previous = load_previous() if previous is None else previous
    seeds = load_seeds() if seeds is None else seeds
    out = [
        "# The seed reports against the measurements\n\n",
        f"Five seed reports measured dilated, block-sparse and ring attention on {HARDWARE}. Each number\n",
        "of their summaries and tables is one claim below, held against the rows that measure the same\n",
        "quantity on the same workload, by one rule (docs/design/verdicts.md in the attnbench repository):\n\n",
        f"- the seed's number stands for every value its printing rounds to it; the measurement (its 95%\n"
        f"  interval where it has one) agrees when it lies within a factor of {v.TOLERANCE:g} of that range;\n",
        "- a claim that also says on which side of a threshold the quantity lies (slower than one GPU:\n"
        "  below 1) holds there when its whole interval does: *direction confirmed, magnitude refuted*\n"
        "  when the side holds and the size does not;\n",
        "- another device's absolute speed and the seeds' arithmetic are *not comparable*; a number\n"
        "  rounded more coarsely than the tolerance cannot be tested by its size;\n",
        "- only a measurement on the seed's terms settles a claim: each seed is judged in one dtype; a\n"
        "  longest sequence in a GPU's memory is searched under that allocator limit (a search under less\n"
        "  memory is a lower bound, a fit's prediction leaves it *not measured yet*); a ring settles a claim\n"
        f"  only where it sent at least {v.RING_SHARE:.0%} of a shard's keys and values per call; a speed ratio's size is\n"
        f"  judged only where its one-GPU calls spend under {v.HOST_SHARE:.0%} of their time on the host (else its\n"
        "  direction alone); DDP claims are held against training steps, DataParallel memory against\n"
        "  cases with the replicas the seed's GPU 1 shows, never a case the speedup tables flag as an\n"
        "  anomaly; and a CPU never stands in for a speed a GPU measured;\n",
        "- memory of a seed that states no heads or head dim is also read over the floor: where half to\n"
        "  twice the assumed width closes the gap, the verdict is *inconclusive* and says so;\n",
        "- each reason names the quantity and the hardware on each side, and what was assumed where the\n"
        "  seed said nothing.\n\n",
        f"{tally(vs)}\n\n",
        changed_text(vs, previous) + ("\n" if previous is not None else ""),
        f"{LEGEND} Measured: value [95% interval] and n samples (a/b: both sides of a ratio); "
        "memory in GB = 10^9 bytes. The CSV `csv/seed-claims.csv` adds each claim's id, the seed's "
        "workload and the rows (FILE:LINE) behind the measurement.\n",
    ]
    for seed, title in SEED_TITLES.items():
        mine = [x for x in vs if x.claim.seed == seed]
        if not mine:
            continue
        out.append(f"\n## {seed}: {title}\n\n{seed_line(seeds.get(seed))}{tally(mine)}\n\n")
        out.append(Table.of("seeds", {h: COLUMNS[h] for h in PAGE_COLUMNS}, mine).markdown())
    return "".join(out)
