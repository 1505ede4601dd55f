"""The report's sections: one per seed report (the five of ``docs/semantics.md``), an executive
summary, the environment and commands, and capacity prediction. Each section function
writes the part of one machine into a ``Doc``; every number comes from that machine's rows.

Table columns follow the seed tables, in the seeds' order; columns a seed lacked (efficiency,
NVML readings, output match) come after them. A table whose rows are missing says which
``attnbench`` command produces them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnbench.measure.stats import anomalous_efficiency
from attnbench.report import data as d
from attnbench.report.claims import speedup_anomalies
from attnbench.report.fit import (
    ACCURACY_TARGET,
    GIB,
    GPU_SIZES_GIB,
    MIN_TRIALS_FOR_TARGET,
    Capacity,
    capacities,
    fit_miss_cause,
)
from attnbench.report.intervals import ms_cell, ratio_cell
from attnbench.report.markdown import Table, result_text, short_message
from attnbench.report.multigpu import (
    STRATEGY_NAMES,
    gpus_in,
    max_seq_by_series,
    memory_per_gpu_cells,
    rank_breakdown,
    ring_pairs,
    scaling_families,
    speedup_cases,
    speedup_groups,
)
from attnbench.report.sweep_tables import (
    max_seq_summary,
    memory_table,
    series_groups,
    summary_table,
    time_table,
)
from attnbench.report.training import training_section
from attnbench.units import (
    format_bytes,
    format_bytes_per_token,
    format_ms,
    format_ratio,
    format_tokens,
    format_tokens_per_s,
)

# The command that produces each kind of data, named where the data is missing.
PRODUCERS = {
    "single": "attnbench run --profile auto",
    "seed-003": "attnbench run --profile seed-003",
    "block-sparse": "attnbench bench --impl block-sparse --seq-lens 64K,128K --param pattern_type=local_window "
                    "--param sparsity_ratio=0.05",
    "speedup": "attnbench speedup --impl dilated --gpus 2",  # the seeds' cases, dp and mp
    "speedup-block-sparse": "attnbench speedup --impl block-sparse --gpus 2",
    "ring-max-seq": "attnbench max-seq --impl ring-dilated --gpus 2 --segment-lengths 2048,4096 --dilation-rates 1,2",
    "ring-points": "attnbench bench --impl ring-dilated --gpus 2 --seq-lens 1M,4M --segment-lengths 2048,4096 "
                   "--dilation-rates 1,2",
    "training": "attnbench run --profile gpu-fwd-bwd",
}
SPARSITY_MODULE = "attnbench.report.sparsity"


# --- formatting -----------------------------------------------------------------------------

def gb(v: float) -> str:
    return format_bytes(v, "GB")


ms, times, tok_s, per_token = format_ms, format_ratio, format_tokens_per_s, format_bytes_per_token


def pct(v: float) -> str:
    return f"{v * 100:+.1f}%"


def tokens_cell(v: float) -> str:
    return format_tokens(int(v))


def yes_no(v: bool) -> str:
    return "yes" if v else "no"


class Doc:
    """Markdown parts, the tables behind them (written as CSV) and figures (written as PNG)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.tables: list[tuple[str, Table]] = []   # (csv file name, table)
        self.figures: list[tuple[str, Any]] = []   # (png file name, matplotlib Figure)
        self.machine_slug = ""

    def add(self, text: str) -> None:
        self.parts.append(text if text.endswith("\n") else text + "\n")

    def heading(self, level: int, text: str) -> None:
        self.add(f"\n{'#' * level} {text}\n")

    def table(self, t: Table) -> None:
        name = f"{t.name}-{self.machine_slug}" if self.machine_slug else t.name
        taken = {n for n, _ in self.tables}
        stem, i = name, 2
        while f"{name}.csv" in taken:
            name, i = f"{stem}-{i}", i + 1
        self.tables.append((f"{name}.csv", t))
        self.add(t.markdown())
        self.add(f"\n<sub>CSV: `csv/{name}.csv`</sub>\n")

    def missing(self, what: str, producer: str) -> None:
        self.add(f"_No data: {what}. `{PRODUCERS[producer]}` produces it._\n")

    def figure(self, name: str, fig, alt: str) -> None:
        if fig is None:
            return
        file = f"{name}-{self.machine_slug}.png"
        self.figures.append((file, fig))
        self.add(f"![{alt}]({file})\n")

    def text(self) -> str:
        return "".join(self.parts)


class Machine:
    """The rows of one machine and what several sections derive from them."""

    def __init__(self, name: str, rows: list[dict[str, Any]]) -> None:
        self.name = name
        self.slug = d.slug(name)
        self.rows = rows
        self.trials = d.trials(rows)
        self.summaries = max_seq_by_series(rows)
        self.capacities = capacities(rows)  # the max-seq-result rows say which searches finished
        self.speedups = speedup_cases(rows)

    def at_max(self, summary: dict[str, Any]) -> dict[str, Any] | None:
        """The successful trial at a max-seq series' largest length."""
        return next((r for r in d.ok(self.trials)
                     if r["series"] == summary["series"] and r["seq_len"] == summary["max_seq_len"]), None)


# --- executive summary ------------------------------------------------------------------------

def largest_records(m: Machine) -> list[dict[str, Any]]:
    records = []
    for s in sorted(m.summaries, key=lambda s: s["world_size"]):
        best = m.at_max(s)
        peak = d.peak_per_gpu(best) if best else None
        held = d.tokens(best) / s["world_size"] if best else None
        records.append({
            "Implementation": s["label"], "GPUs": s["world_size"], "Device": s["device"], "Dtype": s["dtype"],
            "Mode": s["head"].get("mode") or "fwd", "Max Sequence": s["max_seq_len"] or None, "Stopped By": s["stopped_by"],
            "Peak Memory per GPU": peak, "Memory per Token": peak / held if peak and held else None,
            "Peak / Floor": best.get("peak_over_floor") if best else None,
        })
    return records


def executive_summary(doc: Doc, m: Machine) -> None:
    records = largest_records(m)
    if not records:
        doc.missing("no max-seq search on this machine", "single")
    else:
        doc.add("Largest sequence per implementation and GPU count (memory per token: the peak of one GPU over "
                "the tokens that GPU holds):\n")
        doc.table(Table("summary-largest", ["Implementation", "GPUs", "Device", "Dtype", "Mode", "Max Sequence", "Stopped By",
                                             "Peak Memory per GPU", "Memory per Token", "Peak / Floor"], records,
                        {"Max Sequence": tokens_cell, "Peak Memory per GPU": gb, "Memory per Token": per_token,
                         "Peak / Floor": times}))
        bullets = []
        for p, device in sorted({(r["GPUs"], r["Device"]) for r in records}):
            top = max((r for r in records if (r["GPUs"], r["Device"]) == (p, device) and r["Max Sequence"]),
                      key=lambda r: r["Max Sequence"], default=None)
            where = f"{p} GPU{'s' if p > 1 else ''}" if device == "cuda" else f"the {device}"
            if top:
                bullets.append(f"- Longest sequence on {where}: **{format_tokens(top['Max Sequence'])}** "
                               f"tokens with {top['Implementation']} ({top['Dtype']}), stopped by {top['Stopped By']}.")
        ratios = [r for r in records if r["Peak / Floor"]]
        if ratios:
            lo, hi = min(ratios, key=lambda r: r["Peak / Floor"]), max(ratios, key=lambda r: r["Peak / Floor"])
            bullets.append(f"- Peak-to-floor ratio at the largest sequence: from {times(lo['Peak / Floor'])} "
                           f"({lo['Implementation']}) to {times(hi['Peak / Floor'])} ({hi['Implementation']}).")
        doc.add("\n" + "\n".join(bullets) + "\n")
    # an efficiency above 1 beyond its interval is an anomaly to explain, never the headline
    best = max((c for c in m.speedups if c["speedup"] and c["output_match"] is not False
                and not anomalous_efficiency(c["efficiency_ci"])), key=lambda c: c["speedup"], default=None)
    if best:
        doc.add(f"- Best speedup over one GPU: **{ratio_cell(best['speedup_ci'])}** ({STRATEGY_NAMES.get(best['strategy'], best['strategy'])}, "
                f"{best['world_size']} GPUs, {best['impl']}, N={best['seq_len']:,}, batch {best['batch']}; "
                f"efficiency {best['efficiency']:.2f}; {best['timer']} time).\n")
    else:
        doc.add(f"- Best speedup over one GPU: no speedup rows on this machine; `{PRODUCERS['speedup']}` produces them.\n")
    checked = [c for c in m.capacities if c.target_applies and c.error is not None]
    if checked:
        within = [c for c in checked if abs(c.error) <= ACCURACY_TARGET]
        doc.add(f"- Capacity prediction on this GPU: {len(within)} of {len(checked)} series with at least "
                f"{MIN_TRIALS_FOR_TARGET} successful trials predicted within {ACCURACY_TARGET:.0%} of the measured "
                "maximum (see Capacity prediction).\n")


# --- environment and commands -------------------------------------------------------------------

def command_text(command: str) -> str:
    """argv[0] as the user typed it: `attnbench` rather than the module's path."""
    head, _, rest = (command or "").partition(" ")
    if head.endswith(("attnbench/__main__.py", "/attnbench")) or head == "attnbench":
        head = "attnbench"
    return f"{head} {rest}".strip()


def _distinct(values) -> list[Any]:
    out = []
    for v in values:
        if v not in out and v not in (None, "", []):
            out.append(v)
    return out


def gpu_text(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "none"
    names = _distinct(g.get("name") for g in gpus)
    mem = _distinct(round(g.get("memory_total_bytes", 0) / GIB, 1) for g in gpus)
    links = _distinct(g.get("nvlinks_active") for g in gpus)
    text = f"{len(gpus)} × {' + '.join(names)} ({', '.join(f'{x} GiB' for x in mem)} each"
    return text + (f", {', '.join(map(str, links))} NVLinks active" if links else "") + ")"


def environment(doc: Doc, m: Machine) -> None:
    envs = [r.get("env") or {} for r in m.rows]
    dates = sorted(_distinct(e.get("date") for e in envs))
    items = [
        ("GPUs", _distinct(gpu_text(e.get("gpus") or []) for e in envs)),
        ("Driver", _distinct(e.get("driver") for e in envs)),
        ("CUDA (torch build)", _distinct(e.get("cuda") for e in envs)),
        ("cuDNN", _distinct(e.get("cudnn") for e in envs)),
        ("NCCL", _distinct(e.get("nccl") for e in envs)),
        ("torch", _distinct(e.get("torch") for e in envs)),
        ("Python", _distinct(e.get("python") for e in envs)),
        ("CPU", _distinct(f"{e.get('cpu')} ({e.get('cpu_count')} cores)" for e in envs if e.get("cpu"))),
        ("NVML", _distinct(e.get("nvml") for e in envs)),
        ("attnbench commit", _distinct(e.get("commit") for e in envs)),
        ("Date", [f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else dates[0]] if dates else []),
        ("Host", _distinct(e.get("hostname") for e in envs)),
    ]
    doc.table(Table("environment", ["Item", "Value"],
                    [{"Item": k, "Value": "; ".join(map(str, v)) if v else None} for k, v in items]))
    runs: dict[tuple, int] = {}
    for r in m.rows:
        key = (r.get("run"), d.short_commit(r), command_text((r.get("env") or {}).get("command", "")))
        runs[key] = runs.get(key, 0) + 1
    doc.add("\nThe commands that produced these rows (as recorded in each row's `env.command`), and the attnbench "
            "commit that ran them:\n")
    doc.table(Table("commands", ["Run", "Commit", "Command", "Rows"],
                    [{"Run": run, "Commit": commit, "Command": cmd, "Rows": n} for (run, commit, cmd), n in runs.items()],
                    {"Command": lambda c: f"`{c}`"}))
    verify = [r for r in m.rows if r.get("kind") == "verify"]
    if verify:
        doc.add("\nReference checks against the float64 masked reference (relative error ‖out − ref‖ / ‖ref‖):\n")
        doc.table(Table("reference-checks", ["Implementation", "Config", "Dtype", "Device", "N", "Rel. Error",
                                              "Tolerance", "Result"],
                        [{"Implementation": r.get("impl"), "Config": d.config_text(r.get("config")) or None,
                          "Dtype": r.get("dtype"), "Device": r.get("device"), "N": r.get("seq_len"),
                          "Rel. Error": r.get("rel_err"), "Tolerance": r.get("tolerance"), "Result": r.get("status")}
                         for r in verify],
                        {"Rel. Error": lambda v: f"{v:.1e}", "Tolerance": lambda v: f"{v:.0e}"}))


# --- report 000: block-sparse multi-GPU ----------------------------------------------------------

def memory_distribution(doc: Doc, cases: list[dict[str, Any]], name: str) -> None:
    """Report 000/001's per-GPU memory: allocator peak per GPU, NVML device memory at peak after."""
    n = gpus_in([c["row"] for c in cases])
    headers = (["Strategy", "Sequence Length", "Batch Size"] + [f"GPU {i} Memory" for i in range(n)]
               + [f"NVML GPU {i}" for i in range(n)])
    records = [{"Strategy": c["strategy"], "Sequence Length": c["seq_len"], "Batch Size": c["batch"],
                **memory_per_gpu_cells(c["row"], n)} for c in cases]
    doc.add("\nMemory per GPU: `max_memory_allocated` of each GPU; NVML columns: device memory used at the peak "
            "(includes the CUDA context).\n")
    doc.table(Table(name, headers, records, {"Sequence Length": tokens_cell, **{h: gb for h in headers[3:]}}))


def ring_memory_records(m: Machine) -> list[dict[str, Any]]:
    """Memory per GPU of each ring measurement against the same length on one GPU."""
    records = []
    for p in ring_pairs(m.rows):
        r, s = p["row"], p["single"]
        mine, base = d.peak_per_gpu(r), d.peak_per_gpu(s) if s else None
        records.append({"Sequence Length": r["seq_len"], "Implementation": d.describe(r), "GPUs": d.world_size(r),
                        "Tokens per GPU": r["seq_len"] // d.world_size(r), "Memory per GPU": mine,
                        "Single-GPU Memory": base, "Saved per GPU": base - mine if base and mine else None})
    return records


def seed_000(doc: Doc, m: Machine) -> None:
    sparse = [c for c in m.speedups if str(c["impl"]).startswith("block-sparse")]
    doc.heading(4, "Data-parallel performance (block-sparse)")
    if sparse:
        doc.table(Table("000-speedup", ["Sequence Length", "Batch Size", "Strategy", "GPUs", "Speedup", "Notes"],
                        [{"Sequence Length": c["seq_len"], "Batch Size": c["batch"], "Strategy": c["strategy"],
                          "GPUs": c["world_size"], "Speedup": c["speedup_ci"], "Notes": speedup_notes(c)} for c in sparse],
                        {"Sequence Length": tokens_cell, "Speedup": ratio_cell, "Notes": short_message}))
        doc.heading(4, "Memory distribution")
        memory_distribution(doc, sparse, "000-memory-distribution")
    else:
        doc.missing("no block-sparse speedup rows on this machine", "speedup-block-sparse")
    doc.heading(4, "Ring scaling (measured, not theoretical)")
    records = ring_memory_records(m)
    if records:
        doc.table(Table("000-ring-scaling", ["Sequence Length", "Implementation", "GPUs", "Tokens per GPU",
                                             "Memory per GPU", "Single-GPU Memory", "Saved per GPU"], records,
                        {"Sequence Length": tokens_cell, "Tokens per GPU": tokens_cell, "Memory per GPU": gb,
                         "Single-GPU Memory": gb, "Saved per GPU": gb}))
    else:
        doc.missing("no multi-GPU ring rows on this machine", "ring-points")


# --- report 001: multi-GPU capabilities ------------------------------------------------------------

def speedup_notes(c: dict[str, Any]) -> str:
    bits = speedup_anomalies(c) if c["speedup"] else []   # first: a cell is cut to one line
    bits += [c["note"]] if c["note"] else []
    r = c["row"]
    if r.get("status", "ok") != "ok":
        bits.append(r.get("message") or "")
    if c["single"] is None:
        bits.append("no single-GPU row for this case")
    if c["output_match"] is False:
        bits.append("OUTPUT DIFFERS from single GPU")
    return "; ".join(b for b in bits if b)


def seed_001(doc: Doc, m: Machine) -> None:
    if not m.speedups:
        doc.missing("no speedup rows on this machine", "speedup")
        return
    for (strategy, label), cases in speedup_groups(m.speedups).items():
        doc.heading(4, f"{STRATEGY_NAMES.get(strategy, strategy)}: {label}")
        records = [{
            "Sequence Length": c["seq_len"], "Batch Size": c["batch"], "Single GPU Time": c["single_ms"],
            "Multi-GPU Time": c["multi_ms"] if c["row"].get("status", "ok") == "ok" else None,
            "Speedup": c["speedup_ci"], "Notes": speedup_notes(c), "Efficiency": c["efficiency_ci"],
            "Output Match": c["output_match"], "Timer": c["timer"],
        } for c in cases]
        doc.table(Table(f"001-{strategy}", ["Sequence Length", "Batch Size", "Single GPU Time", "Multi-GPU Time",
                                            "Speedup", "Notes", "Efficiency", "Output Match", "Timer"], records,
                        {"Sequence Length": tokens_cell, "Single GPU Time": ms_cell, "Multi-GPU Time": ms_cell,
                         "Speedup": ratio_cell, "Efficiency": lambda v: ratio_cell(v, anomaly_above_one=True),
                         "Output Match": yes_no, "Notes": short_message}))
        memory_distribution(doc, cases, f"001-{strategy}-memory")
    doc.add("\nSpeedup = single-GPU time / multi-GPU time for the same implementation, configuration, length, "
            "batch, dtype, mode and module on this machine; efficiency = speedup / GPUs. Times are medians "
            "±half their 95% bootstrap interval (n samples); a ratio's interval resamples both sides. Timer: "
            "`gpu` where both rows have GPU time (CUDA graph or back-to-back calls), else `eager` (one "
            "synchronised call, dispatch included).\n")


# --- report 002: extreme sequence length ------------------------------------------------------------

def sparsity_section(rows: list[dict[str, Any]]) -> str:
    """Report 002's block-sparse base table, from the block-sparse module where it exists."""
    import importlib

    try:
        module = importlib.import_module(SPARSITY_MODULE)
    except ImportError:
        return ""
    return module.sparsity_table(rows) or ""


def multi_gpu_max_tables(doc: Doc, m: Machine) -> bool:
    found = False
    for s in m.summaries:
        if s["world_size"] == 1:
            continue
        found = True
        rows = sorted((r for r in m.trials if r["series"] == s["series"]), key=lambda r: r["seq_len"])
        n = s["world_size"]
        doc.heading(5, f"{s['label']}: {n} GPUs, {d.settings_text(s['head'])}")
        headers = ["Sequence Length"] + [f"GPU{i} Memory" for i in range(n)] + ["Result", "Notes"]
        records = []
        for r in rows:
            cells = memory_per_gpu_cells(r, n)
            records.append({"Sequence Length": r["seq_len"], **{f"GPU{i} Memory": cells[f"GPU {i} Memory"] for i in range(n)},
                            "Result": r["status"], "Notes": r.get("message") or ""})
        doc.table(Table("002-multi-gpu-max", headers, records,
                        {"Sequence Length": tokens_cell, "Result": result_text, "Notes": short_message,
                         **{f"GPU{i} Memory": gb for i in range(n)}}))
    return found


def seed_002(doc: Doc, m: Machine) -> None:
    single = [s for s in m.summaries if s["world_size"] == 1]
    doc.heading(4, "1. Single GPU maximum")
    if single:
        single_rows = [r for r in m.trials if d.world_size(r) == 1]
        finished = [r for r in m.rows if r.get("kind") == "max-seq-result"]
        doc.add(summary_table(max_seq_summary(single_rows + finished)))
        for s in single:
            rows = sorted((r for r in single_rows if r["series"] == s["series"]), key=lambda r: r["seq_len"])
            doc.heading(5, f"{s['label']}: {d.settings_text(s['head'])}")
            doc.add(memory_table(rows))
    else:
        doc.missing("no single-GPU max-seq search on this machine", "single")
    points = [g for g in series_groups(m.trials).values()
              if g[0]["kind"] == "points" and d.world_size(g[0]) == 1 and not g[0]["impl"].startswith("block-sparse")]
    if points:
        doc.heading(4, "Fixed-length measurements")
        for rows in points:
            doc.heading(5, f"{d.describe(rows[0])}: {d.settings_text(rows[0])}")
            doc.add(time_table(rows))
    doc.heading(4, "Block-sparse base implementation")
    sparse = sparsity_section(m.rows)
    if sparse.strip():
        doc.add(sparse)
    else:
        doc.missing("no block-sparse rows on this machine (or the block-sparse tables are not installed)", "block-sparse")
    doc.heading(4, "2. Multi-GPU maximum")
    if not multi_gpu_max_tables(doc, m):
        doc.missing("no multi-GPU max-seq search on this machine", "ring-max-seq")
    doc.heading(4, "Memory efficiency at the largest sequence")
    records = []
    for s in m.summaries:
        best = m.at_max(s)
        if not best:
            continue
        peak = d.peak_per_gpu(best)
        records.append({"Implementation": s["label"], "GPUs": s["world_size"], "Sequence Length": best["seq_len"],
                        "Input Tensors (QKV)": best.get("inputs_bytes"), "Peak Memory": peak,
                        "Memory per Token": peak / (d.tokens(best) / s["world_size"]) if peak else None,
                        "Peak / Floor": best.get("peak_over_floor")})
    if records:
        doc.table(Table("002-memory-efficiency", ["Implementation", "GPUs", "Sequence Length", "Input Tensors (QKV)",
                                                  "Peak Memory", "Memory per Token", "Peak / Floor"], records,
                        {"Sequence Length": tokens_cell, "Input Tensors (QKV)": gb, "Peak Memory": gb,
                         "Memory per Token": per_token, "Peak / Floor": times}))
    else:
        doc.missing("no successful max-seq trial on this machine", "single")
    doc.add("\nScaling to larger GPUs and the memory estimation formula: see Capacity prediction (a fit of the "
            "measured peaks, not a linear extrapolation of one number).\n")


# --- report 003: dilated configurations, distributed, scaling -------------------------------------

# LongNet dilated attention on one device or over ranks; block-sparse's dilated_sparse
# pattern also takes dilation rates, but it is not what report 003 compares
DILATED_IMPLS = ("dilated", "ring-dilated", "ring-dilated-hilbert")


def is_dilated(head: dict[str, Any]) -> bool:
    return head.get("impl") in DILATED_IMPLS


def is_baseline(head: dict[str, Any]) -> bool:
    """Report 003's baseline: one segment, no dilation."""
    cfg = head.get("config") or {}
    return len(cfg.get("segment_lengths") or []) == 1 and all(r == 1 for r in cfg.get("dilation_rates") or [2])


def dilation_records(m: Machine, group: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int | None, str]:
    """Rows of the configuration table; Dilation Impact compares tokens/s with the baseline
    configuration at the longest length every configuration ran (equal work per token)."""
    ok_rows = {s["series"]: {r["seq_len"]: r for r in d.ok(m.trials) if r["series"] == s["series"]} for s in group}
    common = set.intersection(*(set(v) for v in ok_rows.values())) if ok_rows else set()
    at = max(common) if common else None
    base = next((s for s in group if is_baseline(s["head"])), None)
    base_tps = ok_rows[base["series"]][at].get("tokens_per_s") if base and at else None
    records = []
    for s in group:
        best = ok_rows[s["series"]].get(s["max_seq_len"])
        impact = None
        if base_tps and at:
            mine = ok_rows[s["series"]][at].get("tokens_per_s")
            impact = mine / base_tps if mine else None
        records.append({"Configuration": s["label"], "Max Tokens": s["max_seq_len"] or None,
                        "Memory": best.get("peak_bytes") if best else None,
                        "Throughput": best.get("tokens_per_s") if best else None,
                        "Dilation Impact": impact, "Stopped By": s["stopped_by"]})
    return records, at, base["label"] if base else ""


def seed_003(doc: Doc, m: Machine) -> None:
    doc.heading(4, "Single GPU: maximum sequence per configuration")
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for s in m.summaries:
        if s["world_size"] == 1 and is_dilated(s["head"]):
            groups.setdefault(d.settings_key(s["head"]), []).append(s)
    if not groups:
        doc.missing("no single-GPU max-seq search of a dilated configuration on this machine", "seed-003")
    for group in groups.values():
        records, at, base = dilation_records(m, group)
        doc.heading(5, d.settings_text(group[0]["head"]))
        doc.table(Table("003-configurations", ["Configuration", "Max Tokens", "Memory", "Throughput",
                                               "Dilation Impact", "Stopped By"], records,
                        {"Max Tokens": tokens_cell, "Memory": gb, "Throughput": tok_s,
                         "Dilation Impact": lambda v: f"{v:.2f}x"}))
        if base and at:
            doc.add(f"\nMemory and Throughput at each configuration's Max Tokens. Dilation Impact: tokens/s relative to "
                    f"'{base}' at N={at:,}, the longest length every configuration ran.\n")
        else:
            doc.add("\nDilation Impact needs a single-segment, dilation-1 configuration and a length every "
                    "configuration ran; this group has none.\n")
    doc.heading(4, "Multi-GPU results")
    multi = sorted((r for r in d.ok(m.trials) if d.world_size(r) > 1),
                   key=lambda r: (d.world_size(r), r["seq_len"], d.describe(r)))
    if not multi:
        doc.missing("no multi-GPU ring trials on this machine", "ring-points")
    for p in sorted({d.world_size(r) for r in multi}):
        doc.heading(5, f"{p} GPUs")
        doc.table(Table("003-distributed", ["Sequence", "Configuration", "Time", "Throughput", "Memory/GPU"],
                        [{"Sequence": r["seq_len"], "Configuration": d.describe(r), "Time": r.get("time_ms"),
                          "Throughput": r.get("tokens_per_s"), "Memory/GPU": d.peak_per_gpu(r)}
                         for r in multi if d.world_size(r) == p],
                        {"Sequence": tokens_cell, "Time": ms, "Throughput": tok_s, "Memory/GPU": gb}))
    doc.heading(4, "Scaling: theoretical vs actual")
    families = scaling_families(m.rows)
    if not families:
        doc.missing("no multi-GPU max-seq search on this machine", "ring-max-seq")
    caps = {c.series: c for c in m.capacities}
    for fam in families:
        single = fam["single"]
        doc.heading(5, f"{d.describe(fam['head'])}: {d.settings_text(fam['head'])}")
        one = single["max_seq_len"] if single else None
        records = []
        if single:
            c1 = caps.get(single["series"])
            records.append({"GPUs": 1, "Theoretical Max": one, "Expected": c1.predicted if c1 else None, "Actual": one})
        for s in fam["multi"]:
            cp = caps.get(s["series"])
            records.append({"GPUs": s["world_size"], "Theoretical Max": one * s["world_size"] if one else None,
                            "Expected": cp.predicted if cp else None, "Actual": s["max_seq_len"] or None})
        doc.table(Table("003-scaling", ["GPUs", "Theoretical Max", "Expected", "Actual"], records,
                        {"Theoretical Max": tokens_cell, "Expected": tokens_cell, "Actual": tokens_cell}))
        doc.add("\nTheoretical Max: GPUs × the measured single-GPU maximum (memory split perfectly, O(N/P) per GPU)"
                + ("" if single else "; no single-GPU max-seq of this configuration was measured here") +
                ". Expected: the capacity fit of that GPU count's own per-GPU peaks, solved for this GPU's memory. "
                "Actual: the measured max-seq.\n")


# --- report 004: ring vs one GPU -------------------------------------------------------------------

def seed_004(doc: Doc, m: Machine) -> None:
    pairs = ring_pairs(m.rows)
    if not pairs:
        doc.missing("no multi-GPU ring rows on this machine", "ring-points")
        return
    records = []
    for p in pairs:
        r, s = p["row"], p["single"]
        records.append({
            "Sequence Length": r["seq_len"], "Configuration": d.describe(r), "GPUs": d.world_size(r),
            "Single GPU Time": s.get("time_ms") if s else None, "Single GPU Tokens/s": s.get("tokens_per_s") if s else None,
            "Single GPU Memory": d.peak_per_gpu(s) if s else None, "Ring Time": r.get("time_ms"),
            "Ring Tokens/s": r.get("tokens_per_s") or (d.tokens(r) / (r["time_ms"] / 1e3) if r.get("time_ms") else None),
            "Memory per GPU": d.peak_per_gpu(r),
            "Overhead": r["time_ms"] / s["time_ms"] if s and s.get("time_ms") and r.get("time_ms") else None,
            "Baseline": f"{p['baseline']}: {s['impl']}" if s else None,
            "Sent per Call": r.get("sent_bytes"), "algbw (GB/s)": r.get("algbw_gbps"),
        })
    doc.table(Table("004-ring-vs-single", list(records[0]), records,
                    {"Sequence Length": tokens_cell, "Single GPU Time": ms, "Single GPU Tokens/s": tok_s,
                     "Single GPU Memory": gb, "Ring Time": ms, "Ring Tokens/s": tok_s, "Memory per GPU": gb,
                     "Overhead": times, "Sent per Call": format_bytes, "algbw (GB/s)": lambda v: f"{v:,.2f}"}))
    doc.add("\nOverhead = ring time / single-GPU time at the same length (below 1: the ring is faster). Ring time is "
            "the slowest rank's; memory is `max_memory_allocated` of the fullest GPU. Baseline `equal work`: the "
            "single-device implementation of the same key sets over the whole sequence on one GPU (sdpa for ring, "
            "dilated for ring-dilated); `same split`: the same implementation on one rank, used only where no "
            "equal-work row was measured. Sent per Call: bytes the busiest rank sends; algbw: those bytes over the "
            "call's time (nccl-tests' algbw).\n")
    ranks = rank_breakdown(m.rows)
    if ranks:
        doc.heading(4, "Where the time goes, per rank")
        doc.table(Table("004-ranks", ["Sequence Length", "Configuration", "Rank", "Compute (ms)",
                                      "Waiting on Communication (ms)"],
                        [{"Sequence Length": x["row"]["seq_len"], "Configuration": d.describe(x["row"]), "Rank": x["rank"],
                          "Compute (ms)": x["compute_ms"], "Waiting on Communication (ms)": x["comm_wait_ms"]}
                         for x in ranks],
                        {"Sequence Length": tokens_cell, "Compute (ms)": lambda v: f"{v:,.2f}",
                         "Waiting on Communication (ms)": lambda v: f"{v:,.2f}"}))


# --- capacity prediction ---------------------------------------------------------------------------

def capacity_records(caps: list[Capacity]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """(fit, prediction on the measured device, prediction per GPU size) records per fitted series."""
    fits, here, sizes = [], [], []
    for c in caps:
        name = c.label + (f" ({c.world_size} GPUs)" if c.world_size > 1 else "")
        fits.append({
            "Implementation": name, "Dtype": c.head.get("dtype"),
            "Model": ("quadratic" if c.fit.degree == 2 else "linear") + f": peak ≈ {c.fit.formula()}",
            "Successful Trials": c.successful, "Max Fit Error": c.fit.max_error,
            "Fit Error at Largest N": c.fit.error_at_largest,
        })
        here.append({
            "Implementation": name, "Device Memory": c.device_total, "Set Aside": c.overhead, "Budget": c.budget,
            "Predicted Max": c.predicted, "Measured Max": c.measured_max, "Stopped By": c.stopped_by,
            "Prediction Error": c.error,
            "Within 5%": (abs(c.error) <= ACCURACY_TARGET) if c.target_applies and c.error is not None else None,
            "Note": fit_miss_cause(c) if c.error is not None and abs(c.error) > ACCURACY_TARGET else "",
        })
        sizes.append({"Implementation": name, **{f"{g} GB": c.predict_for(g * GIB) for g in GPU_SIZES_GIB}})
    return fits, here, sizes


def capacity(doc: Doc, m: Machine) -> None:
    caps = [c for c in m.capacities if c.fit]
    if not caps:
        doc.missing("no series with enough successful trials to fit (2 lengths, 3 for a quadratic model)", "single")
    else:
        capacity_tables(doc, caps)
    for c in m.capacities:
        if not c.fit:
            doc.add(f"\nNot fitted: {c.label} ({c.successful_lengths} successful lengths; a "
                    f"{'quadratic' if c.degree == 2 else 'linear'} model needs {c.degree + 1}).\n")


def capacity_tables(doc: Doc, caps: list[Capacity]) -> None:
    fits, here, sizes = capacity_records(caps)
    doc.add("Peak memory per GPU (`max_memory_reserved` on a GPU, the allocator's whole footprint, fragmentation "
            "included; resident-set growth on a CPU) fitted against sequence length over each series' successful trials by least squares (linear; "
            "quadratic where N × N scores are held). Max Fit Error: the largest relative error of the fit on the "
            "measured points (small lengths, where fixed costs dominate, weigh most); Fit Error at Largest N: its "
            "error at the longest measured length.\n")
    doc.table(Table("capacity-fit", list(fits[0]), fits,
                    {"Max Fit Error": lambda v: f"{v * 100:.1f}%", "Fit Error at Largest N": pct}))
    doc.add("\nOn the measured device: Predicted Max solves the fit for Budget, the memory the allocator can use "
            "(Device Memory minus Set Aside); Prediction Error compares it with the measured max-seq where memory "
            f"stopped the search. Target: within {ACCURACY_TARGET:.0%} for every GPU series with at least "
            f"{MIN_TRIALS_FOR_TARGET} successful trials.\n")
    doc.table(Table("capacity-measured", list(here[0]), here,
                    {"Device Memory": gb, "Set Aside": gb, "Budget": gb, "Predicted Max": tokens_cell,
                     "Measured Max": tokens_cell, "Prediction Error": pct, "Within 5%": yes_no}))
    doc.add("\nAssumption: " + "; ".join(_distinct(c.budget_note for c in caps)) + ".\n")
    doc.add("\nPredicted max sequence for other GPU sizes (nominal GiB, the same memory set aside as here):\n")
    doc.table(Table("capacity-gpus", list(sizes[0]), sizes, {f"{g} GB": tokens_cell for g in GPU_SIZES_GIB}))


# --- plots ----------------------------------------------------------------------------------------

def plots(doc: Doc, m: Machine) -> None:
    from attnbench.report import plots as p

    before = len(doc.figures)
    doc.figure("memory", p.memory_plot(m.rows, m.name), "peak memory vs sequence length, with the memory floor dashed")
    doc.figure("time", p.time_plot(m.rows, m.name), "time vs sequence length, log-log")
    doc.figure("tflops", p.tflops_plot(m.rows, m.name), "achieved TFLOP/s vs sequence length")
    doc.figure("speedup", p.speedup_plot(m.speedups, m.name), "speedup per strategy and GPU count")
    if len(doc.figures) == before:
        doc.missing("no successful trials to plot on this machine", "single")
    elif not any(c["speedup"] for c in m.speedups):
        doc.missing("no speedup bars (no speedup rows on this machine)", "speedup")


# Sections in report order: (anchor title, seed file it regenerates or None, function).
SECTIONS: list[tuple[str, str | None, Callable[[Doc, Machine], None]]] = [
    ("Executive summary", None, executive_summary),
    ("Report 000: block-sparse multi-GPU analysis", "000_d442633bf7a6a946.txt", seed_000),
    ("Report 001: multi-GPU capabilities (single GPU vs data parallel)", "001_f351c47f35f6c2cf.txt", seed_001),
    ("Report 002: extreme sequence length", "002_eb8e9fa29ff73d94.txt", seed_002),
    ("Report 003: dilated configurations and multi-GPU scaling", "003_44f2437c03de4e52.txt", seed_003),
    ("Report 004: ring attention, single GPU vs multi-GPU", "004_e2d2d58acab56c17.txt", seed_004),
    ("Training: forward plus backward", None, training_section),
    ("Capacity prediction", None, capacity),
    ("Plots", None, plots),
    ("Environment and commands (appendix)", None, environment),
]

