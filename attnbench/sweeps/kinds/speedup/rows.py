"""A speedup trial's measured part from its ranks' results (pure: tests feed it by hand): each
iteration's time is the slowest rank's, each GPU gets its allocator peak and its NVML reading,
and the output is compared with the single-GPU run's, pooled over the ranks."""

from __future__ import annotations

import math

from attnbench.plan import Case, Series
from attnbench.results.schema import GpuMemory, Speedup, StepMeasured
from attnbench.runtime.jobs import RankEnded
from attnbench.trials.placed import Compared, RankResult, merge
from attnbench.trials.reference import TOLERANCE
from attnbench.trials.strategies import Strategy


def gpus_of(s: Series) -> int:
    """GPUs a speedup series spreads over (processes on the CPU)."""
    return s.settings.gpus[0] if s.settings.gpus else 2


def gpu_rows(count: int, nvml: list[GpuMemory] | None, allocator: dict[str, dict[str, int]]) -> list[GpuMemory]:
    """One record per GPU of the run (CUDA index): NVML used memory before and at peak (the
    sampler numbers GPUs as CUDA does), and the allocator peaks of the process that used it
    (None where none did)."""
    by_cuda = {g.index: g for g in nvml or []}
    rows = []
    for i in range(count):
        seen = by_cuda.get(i, GpuMemory(index=i))
        alloc = allocator.get(str(i), {})
        rows.append(
            GpuMemory(
                index=i,
                nvml_index=seen.nvml_index,
                nvml_used_before=seen.nvml_used_before,
                nvml_used_peak=seen.nvml_used_peak,
                max_memory_allocated=alloc.get("max_memory_allocated"),
                max_memory_reserved=alloc.get("max_memory_reserved"),
            )
        )
    return rows


def relative_error(parts: list[Compared | None]) -> tuple[float | None, int]:
    """sqrt(sum of squared errors / sum of squared reference values) over the ranks' shares."""
    if not parts or any(p is None for p in parts):
        return None, 0
    err, ref = sum(p.sq_err for p in parts), sum(p.sq_ref for p in parts)
    elements = sum(p.elements for p in parts)
    if any(p.nonfinite for p in parts) or not math.isfinite(err):
        return float("nan"), elements
    return (math.sqrt(err / ref) if ref > 0 else math.sqrt(err)), elements


def merge_ranks(ended: list[RankEnded], s: Series, case: Case, strategy: Strategy) -> StepMeasured:
    """The measured part of one trial's row from how its ranks ended (``placed.merge``: each
    call the slowest rank's), each GPU's memory, and the output check (pure: tests feed it by hand)."""
    m = StepMeasured(status="error", message="", times_ms=[], processes=len(ended))
    results = merge(m, ended)
    if m.time_ms:
        m.tokens_per_s = case.batch * case.seq_len / (m.time_ms / 1e3)
    allocator = {d: a for r in results for d, a in (r.allocator or {}).items()}
    nvml = [g for r in results for g in r.nvml or []]
    m.gpus = gpu_rows(gpus_of(s), nvml, allocator) if s.settings.device == "cuda" else []
    m.replica_batches = results[0].replica_batches
    m.tolerance = TOLERANCE[s.settings.dtype]
    if m.status == "ok" and strategy.name != "single":  # the single run is the reference
        check_output(m, results, s, case, strategy)
    if m.output_match is False:
        m.status, m.message = "error", m.output_message
    return m


def check_output(m: StepMeasured, results: list[RankResult], s: Series, case: Case, strategy: Strategy) -> None:
    """``m``'s output fields: the ranks' shares pooled against the single run's output within
    ``m.tolerance``, and rank 0's parameter gradients against its gradients."""
    tol = m.tolerance
    rel, elements = relative_error([r.compare for r in results])
    if rel is None:
        m.output_message = "no single-GPU output to compare with"
        return
    width = s.settings.heads * s.settings.head_dim
    if elements != case.batch * case.seq_len * width:
        m.output_rel_err, m.output_match = rel, False
        m.output_message = (
            f"ranks returned {elements} output values, the single run {case.batch * case.seq_len * width}"
        )
        return
    grad_rel, _ = relative_error([results[0].grad_compare]) if results[0].grad_compare else (None, 0)
    # a compressed all-reduce rounds the gradients to its own dtype
    grad_tol = (
        max(tol, TOLERANCE[s.settings.speedup.grad_compression])
        if s.settings.speedup.grad_compression and strategy.name == "mp"
        else tol
    )
    m.output_rel_err, m.output_match = rel, rel <= tol and (grad_rel is None or grad_rel <= grad_tol)
    m.grad_rel_err, m.grad_tolerance = grad_rel, grad_tol if grad_rel is not None else None
    if not m.output_match:
        what = (
            f"output relative error {rel:.2e} > tolerance {tol:.0e}"
            if not rel <= tol
            else f"parameter-gradient relative error {grad_rel:.2e} > tolerance {grad_tol:.0e}"
        )
        m.output_message = f"differs from the single-GPU run: {what} ({s.settings.dtype})"


def notes_for(row: Speedup, strategy: Strategy) -> str:
    """What really happened, in words, from the row itself."""
    notes = list(strategy.notes(row)) if row.status == "ok" else []
    if row.output_match is True:
        extra = f", gradients {row.grad_rel_err:.1e}" if row.grad_rel_err is not None else ""
        notes.append(f"output = single (rel. err {row.output_rel_err:.1e}{extra})")
    elif row.output_message and row.status == "ok":
        notes.append(row.output_message)
    if row.nvml_note:
        notes.append(f"{row.nvml_note}: memory from torch only")
    if row.device == "cpu":
        notes.append(f"CPU: {row.processes} process{'es' if row.processes > 1 else ''}, no GPU memory")
    return "; ".join(notes)
