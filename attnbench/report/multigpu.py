"""Multi-GPU quantities derived from rows of one machine: speedup over a single GPU,
memory per GPU, ring (sequence-parallel) runs against their single-GPU counterpart, and
measured max-seq per GPU count.

Row contracts read here (README "Result rows"):
- ``kind: speedup``: ``strategy`` (single, dp, mp, ring), ``world_size``, ``module``,
  the workload, ``time_ms``, ``status``, ``output_match``, ``note``, ``gpus``.
- ring trials: ``kind: max-seq | points`` with ``world_size > 1``, ``strategy: ring``, time
  of the slowest rank, ``gpus`` per rank's GPU, optionally ``ranks`` with ``compute_ms`` and
  ``comm_wait_ms``.
"""

from __future__ import annotations

from typing import Any

from attnbench.report.data import (
    config_id,
    config_text,
    configs_agree,
    gpu_memory,
    ok,
    settings_key,
    trials,
    world_size,
)
from attnbench.report.intervals import divided, speedup_interval, time_interval, timer_for
from attnbench.report.sweep_tables import max_seq_summary, series_groups

SPEEDUP_KIND = "speedup"
STRATEGY_NAMES = {
    "single": "Single GPU",
    "dp": "DataParallel",
    "mp": "Multi-process data parallel (DDP)",
    "ring": "Ring (sequence parallel)",
}


def speedup_trials(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("kind") == SPEEDUP_KIND]


def _case_key(r: dict[str, Any]) -> tuple:
    return (
        r.get("impl"),
        config_id(r.get("config")),
        r.get("seq_len"),
        r.get("module") or "attention",
        *settings_key(r),
    )


def _pick(candidates: list[dict[str, Any]], row: dict[str, Any]) -> dict[str, Any] | None:
    """The baseline for ``row``: one from the same run if there is one, else the latest; never an average."""
    if not candidates:
        return None
    same_run = [c for c in candidates if c.get("run") == row.get("run")]
    return (same_run or candidates)[-1]


def speedup_cases(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each multi-GPU speedup row with its single-GPU baseline (same case, same machine)."""
    rows = speedup_trials(rows)
    singles: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        if r.get("strategy") == "single":
            singles.setdefault(_case_key(r), []).append(r)
    cases = []
    for r in rows:
        if r.get("strategy") == "single":
            continue
        base = _pick(singles.get(_case_key(r), []), r)
        ran = base and base.get("status", "ok") == "ok" and r.get("status", "ok") == "ok"
        # GPU time where both sides have it, else eager time; the interval from both sample sets
        speedup_ci, timer = speedup_interval(base, r) if ran else (None, timer_for(base, r))
        efficiency_ci = divided(speedup_ci, world_size(r))
        cases.append(
            {
                "row": r,
                "single": base,
                "strategy": r.get("strategy"),
                "world_size": world_size(r),
                "impl": r.get("impl"),
                "seq_len": r.get("seq_len"),
                "batch": r.get("batch"),
                "timer": timer,
                "single_ms": time_interval(base, timer),
                "multi_ms": time_interval(r, timer),
                "speedup": speedup_ci.value if speedup_ci else None,
                "speedup_ci": speedup_ci,
                "efficiency": efficiency_ci.value if efficiency_ci else None,
                "efficiency_ci": efficiency_ci,
                "output_match": r.get("output_match"),
                "note": r.get("note") or "",
            }
        )
    return cases


def group_label(r: dict[str, Any]) -> str:
    cfg = config_text(r.get("config"))
    return (
        f"{r.get('impl')}{f'({cfg})' if cfg else ''}, {r.get('module') or 'attention'}, {r.get('mode')}, "
        f"{r.get('dtype')}, {world_size(r)} GPUs"
    )


def speedup_groups(cases: list[dict[str, Any]]) -> dict[tuple, list[dict[str, Any]]]:
    """Cases by strategy, then by everything but the (length, batch) case."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for c in cases:
        r = c["row"]
        key = (c["strategy"], group_label(r))
        groups.setdefault(key, []).append(c)
    order = list(STRATEGY_NAMES)
    return {
        k: sorted(v, key=lambda c: (c["seq_len"], c["batch"] or 0))
        for k, v in sorted(
            groups.items(), key=lambda kv: (order.index(kv[0][0]) if kv[0][0] in order else 99, kv[0][1])
        )
    }


# --- ring runs against one GPU --------------------------------------------------------------


def is_ring_trial(r: dict[str, Any]) -> bool:
    return world_size(r) > 1 and r.get("kind") in ("max-seq", "points")


def counterparts(impl: str) -> tuple[str, ...]:
    """Single-device implementations that compute what ``impl`` computes, preferred first."""
    from attnbench import impls

    counterpart = impls.counterpart(impl)
    return (impl, counterpart) if counterpart else (impl,)


#: which single-GPU row a multi-GPU ring row is compared with
EQUAL_WORK = (
    "equal work"  # the single-device counterpart over the whole sequence (sdpa for ring, dilated for ring-dilated)
)
SAME_SPLIT = "same split"  # the same implementation on one rank


def _same_workload(row: dict[str, Any], impl: str, candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
    found = [
        c
        for c in candidates
        if c.get("impl") == impl
        and c.get("seq_len") == row.get("seq_len")
        and settings_key(c) == settings_key(row)
        and configs_agree(c.get("config"), row.get("config"))
    ]
    return _pick(found, row)


def baselines(row: dict[str, Any], candidates: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
    """The single-GPU rows of the same workload and length: ``equal work`` (the best
    single-device implementation of the same key sets over the whole sequence) and ``same
    split`` (the same implementation on one rank), each None where not measured."""
    from attnbench import impls

    impl = row.get("impl")
    counterpart = impls.counterpart(impl)
    return {
        EQUAL_WORK: _same_workload(row, counterpart, candidates) if counterpart else None,
        SAME_SPLIT: _same_workload(row, impl, candidates),
    }


def single_match(row: dict[str, Any], candidates: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, str | None]:
    """The single-GPU row a ring row is compared with, and which baseline it is: the equal-work
    one where measured, else the same implementation on one rank."""
    found = baselines(row, candidates)
    for kind in (EQUAL_WORK, SAME_SPLIT):
        if found[kind]:
            return found[kind], kind
    return None, None


def ring_pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Successful multi-GPU ring measurements, each with its single-GPU baseline (or None) and
    which baseline that is (``EQUAL_WORK`` or ``SAME_SPLIT``)."""
    pairs = []
    singles = [r for r in ok(trials(rows)) if world_size(r) == 1]
    for r in ok(trials(rows)):
        if is_ring_trial(r):
            single, kind = single_match(r, singles)
            pairs.append({"row": r, "single": single, "baseline": kind})
    for c in speedup_cases(rows):
        if c["strategy"] == "ring" and c["row"].get("status", "ok") == "ok":
            pairs.append({"row": c["row"], "single": c["single"], "baseline": SAME_SPLIT if c["single"] else None})
    return sorted(pairs, key=lambda p: (p["row"].get("impl"), p["row"]["seq_len"], world_size(p["row"])))


def rank_breakdown(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: compute time and time spent waiting on communication, where rows record it."""
    out = []
    for p in ring_pairs(rows):
        for i, rank in enumerate(p["row"].get("ranks") or []):
            out.append(
                {
                    "row": p["row"],
                    "rank": rank.get("rank", i),
                    "compute_ms": rank.get("compute_ms"),
                    "comm_wait_ms": rank.get("comm_wait_ms"),
                }
            )
    return out


# --- max-seq per GPU count ------------------------------------------------------------------


def max_seq_by_series(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """max_seq_summary with each series' first trial (its settings and world size)."""
    groups = series_groups(trials(rows))
    return [
        {**s, "head": groups[s["series"]][0], "world_size": world_size(groups[s["series"]][0])}
        for s in max_seq_summary(rows)
    ]  # with the max-seq-result rows: which searches finished


def scaling_families(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each multi-GPU max-seq series with the single-GPU max-seq series it is compared with."""
    summaries = max_seq_by_series(rows)
    singles = [s for s in summaries if s["world_size"] == 1]
    families: dict[tuple, dict[str, Any]] = {}
    for s in summaries:
        if s["world_size"] == 1:
            continue
        head = s["head"]
        key = (head.get("impl"), config_id(head.get("config")), settings_key(head))
        fam = families.setdefault(key, {"head": head, "multi": [], "single": None})
        fam["multi"].append(s)
        if fam["single"] is None:
            for impl in counterparts(head.get("impl")):
                found = [
                    x
                    for x in singles
                    if x["head"].get("impl") == impl
                    and settings_key(x["head"]) == settings_key(head)
                    and configs_agree(x["head"].get("config"), head.get("config"))
                ]
                if found:
                    fam["single"] = _pick(found, head)
                    break
    for fam in families.values():
        fam["multi"].sort(key=lambda s: s["world_size"])
    return list(families.values())


def memory_per_gpu_cells(row: dict[str, Any], n_gpus: int) -> dict[str, Any]:
    """GPU i Memory (allocator peak) and NVML GPU i (device memory used at peak), raw bytes."""
    cells: dict[str, Any] = {}
    mem = {g["index"]: g for g in gpu_memory(row)}
    for i in range(n_gpus):
        g = mem.get(i, {})
        cells[f"GPU {i} Memory"] = g.get("allocated")
        cells[f"NVML GPU {i}"] = g.get("nvml_peak")
    return cells


def gpus_in(rows: list[dict[str, Any]]) -> int:
    return max((max(world_size(r), len(r.get("gpus") or [])) for r in rows), default=1)
