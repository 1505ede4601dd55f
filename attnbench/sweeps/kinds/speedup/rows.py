"""A speedup trial's row from its ranks' results (pure: tests feed it by hand): each
iteration's time is the slowest rank's, each GPU gets its allocator peak and its NVML reading,
and the output is compared with the single-GPU run's, pooled over the ranks."""

from __future__ import annotations

import math
from typing import Any

from attnbench.plan import Case, Series
from attnbench.results.schema import Fields
from attnbench.sweeps.kinds.speedup.strategies import Strategy
from attnbench.trials.reference import TOLERANCE


def gpus_of(s: Series) -> int:
    """GPUs a speedup series spreads over (processes on the CPU)."""
    return s.settings.gpus[0] if s.settings.gpus else 2


def slowest_per_iteration(per_rank: list[list[float]]) -> list[float]:
    """Iteration i of a data-parallel step ends when its slowest rank ends."""
    if not per_rank or any(len(t) != len(per_rank[0]) for t in per_rank):
        raise ValueError("ranks timed different numbers of iterations")
    return [max(column) for column in zip(*per_rank)]


def gpu_rows(count: int, nvml: list[dict[str, int]] | None, allocator: dict[str, dict[str, int]]) -> list[Fields]:
    """One row per GPU of the run (CUDA index): NVML used memory before and at peak (the
    sampler numbers GPUs as CUDA does), and the allocator peaks of the process that used it
    (None where none did)."""
    by_cuda = {g["index"]: g for g in nvml or []}
    rows = []
    for i in range(count):
        seen = by_cuda.get(i, {})
        alloc = allocator.get(str(i), {})
        rows.append(
            {
                "index": i,
                "nvml_index": seen.get("nvml_index"),
                "nvml_used_before": seen.get("nvml_used_before"),
                "nvml_used_peak": seen.get("nvml_used_peak"),
                "max_memory_allocated": alloc.get("max_memory_allocated"),
                "max_memory_reserved": alloc.get("max_memory_reserved"),
            }
        )
    return rows


def relative_error(parts: list[dict[str, Any] | None]) -> tuple[float | None, int]:
    """sqrt(sum of squared errors / sum of squared reference values) over the ranks' shares."""
    if not parts or any(p is None for p in parts):
        return None, 0
    err, ref = sum(p["sq_err"] for p in parts), sum(p["sq_ref"] for p in parts)
    if any(p.get("nonfinite") for p in parts) or not math.isfinite(err):
        return float("nan"), sum(p["elements"] for p in parts)
    return (math.sqrt(err / ref) if ref > 0 else math.sqrt(err)), sum(p["elements"] for p in parts)


def merge_ranks(results: list[dict[str, Any]], s: Series, case: Case, strategy: Strategy) -> Fields:
    """The row fields of one trial from its ranks' results (pure: tests feed it by hand)."""
    from attnbench.measure.timing import sample_statistics, summarize
    from attnbench.runtime.distributed import agreed_status

    status, message = agreed_status(results)
    row: Fields = {"status": status, "message": message, "processes": len(results)}
    ok = status == "ok"
    row["times_ms"] = slowest_per_iteration([r["times_ms"] for r in results]) if ok else []
    lead = results[0]
    if ok and len(results) == 1 and lead.get("gpu_times_ms") is not None:  # one process: its GPU time
        row.update(gpu_times_ms=lead["gpu_times_ms"], gpu_timer=lead.get("gpu_timer"))
    row.update(vars(sample_statistics(row["times_ms"], row.get("gpu_times_ms"))))
    row["first_call_ms"] = max((r.get("first_call_ms") or 0 for r in results), default=None) or None
    if row["time_ms"]:
        row["tokens_per_s"] = case.batch * case.seq_len / (row["time_ms"] / 1e3)
    allocator = {d: a for r in results for d, a in (r.get("allocator") or {}).items()}
    row["gpus"] = gpu_rows(gpus_of(s), lead.get("nvml"), allocator) if s.settings.device == "cuda" else []
    row["ranks"] = [
        {k: r.get(k) for k in ("rank", "status", "devices", "cpu_peak_rss")}
        | {"first_call_ms": r.get("rank_first_call_ms"), "time_ms": summarize(r.get("times_ms") or [])["time_ms"]}
        for r in results
    ]
    row["backend"] = lead.get("backend")
    for key in ("replica_batches", "nvml_note"):
        if lead.get(key) is not None:
            row[key] = lead[key]
    row.update(_output_check(results, s, case, strategy, ok))
    if row.get("output_match") is False:
        row.update(status="error", message=row["output_message"])
    return row


def _output_check(results, s: Series, case: Case, strategy: Strategy, ok: bool) -> Fields:
    tol = TOLERANCE[s.settings.dtype]
    out: Fields = {"output_match": None, "output_rel_err": None, "tolerance": tol}
    if strategy.name == "single" or not ok:
        return out
    rel, elements = relative_error([r.get("compare") for r in results])
    if rel is None:
        return {**out, "output_message": "no single-GPU output to compare with"}
    width = s.settings.heads * s.settings.head_dim
    if elements != case.batch * case.seq_len * width:
        return {
            **out,
            "output_rel_err": rel,
            "output_match": False,
            "output_message": f"ranks returned {elements} output values, the single run {case.batch * case.seq_len * width}",
        }
    grad_rel, _ = relative_error([results[0].get("grad_compare")]) if results[0].get("grad_compare") else (None, 0)
    # a compressed all-reduce rounds the gradients to its own dtype
    grad_tol = (
        max(tol, TOLERANCE[s.settings.grad_compression])
        if s.settings.grad_compression and strategy.name == "mp"
        else tol
    )
    match = rel <= tol and (grad_rel is None or grad_rel <= grad_tol)
    out.update(
        output_rel_err=rel,
        output_match=match,
        grad_rel_err=grad_rel,
        grad_tolerance=grad_tol if grad_rel is not None else None,
    )
    if not match:
        what = (
            f"output relative error {rel:.2e} > tolerance {tol:.0e}"
            if not rel <= tol
            else f"parameter-gradient relative error {grad_rel:.2e} > tolerance {grad_tol:.0e}"
        )
        out["output_message"] = f"differs from the single-GPU run: {what} ({s.settings.dtype})"
    return out


def notes_for(row: Fields, strategy: Strategy) -> str:
    """What really happened, in words, from the row itself."""
    notes = list(strategy.notes(row)) if row["status"] == "ok" else []
    if row.get("output_match") is True:
        extra = f", gradients {row['grad_rel_err']:.1e}" if row.get("grad_rel_err") is not None else ""
        notes.append(f"output = single (rel. err {row['output_rel_err']:.1e}{extra})")
    elif row.get("output_message") and row["status"] == "ok":
        notes.append(row["output_message"])
    if row.get("nvml_note"):
        notes.append(f"{row['nvml_note']}: memory from torch only")
    if row["device"] == "cpu":
        notes.append(f"CPU: {row['processes']} process{'es' if row['processes'] > 1 else ''}, no GPU memory")
    return "; ".join(notes)
