"""What a timed call did: FLOPs useful and executed, the kept fraction, throughput."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Accounting:
    """A call's work, named as a row's fields (throughput only where it has a time)."""

    flops_useful: float
    flops_executed: float
    kept_fraction: float
    pairs_counted: str | None = None  # counted from a declared mask: exactly, or by blocks
    tokens_per_s: float | None = None
    tflops_useful: float | None = None
    tflops_executed: float | None = None


def accounting(impl, wl, time_ms: float | None) -> Accounting:
    """The work of implementation ``impl`` on workload ``wl`` taking ``time_ms`` per call."""
    useful = wl.flops(impl.useful_pairs(wl.seq_len, wl.heads, wl.causal))
    executed = wl.flops(impl.executed_pairs(wl.seq_len, wl.heads, wl.causal))
    out = Accounting(
        flops_useful=useful,
        flops_executed=executed,
        kept_fraction=impl.useful_pairs(wl.seq_len, wl.heads, wl.causal) / (wl.heads * wl.seq_len**2),
        pairs_counted=getattr(impl, "pairs_counted", None) or None,
    )
    if time_ms:
        out.tokens_per_s = wl.batch * wl.seq_len / (time_ms / 1e3)
        out.tflops_useful = useful / (time_ms / 1e3) / 1e12
        out.tflops_executed = executed / (time_ms / 1e3) / 1e12
    return out
