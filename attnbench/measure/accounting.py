"""What a timed call did: FLOPs useful and executed, the kept fraction, throughput."""

from __future__ import annotations

from typing import Any


def accounting(impl, wl, time_ms: float | None) -> dict[str, Any]:
    """Row fields for implementation ``impl`` on workload ``wl`` taking ``time_ms`` per call."""
    useful = wl.flops(impl.useful_pairs(wl.seq_len, wl.heads, wl.causal))
    executed = wl.flops(impl.executed_pairs(wl.seq_len, wl.heads, wl.causal))
    out = {
        "flops_useful": useful,
        "flops_executed": executed,
        "kept_fraction": impl.useful_pairs(wl.seq_len, wl.heads, wl.causal) / (wl.heads * wl.seq_len**2),
    }
    if getattr(impl, "pairs_counted", None):  # counted from a declared mask: exact or by blocks
        out["pairs_counted"] = impl.pairs_counted
    if time_ms:
        out.update(
            tokens_per_s=wl.batch * wl.seq_len / (time_ms / 1e3),
            tflops_useful=useful / (time_ms / 1e3) / 1e12,
            tflops_executed=executed / (time_ms / 1e3) / 1e12,
        )
    return out
