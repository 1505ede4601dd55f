"""What a timed call did: FLOPs useful and executed, the kept fraction, throughput; from pair
counts that are counted, declared by the implementation, or unknown (and why)."""

from __future__ import annotations

from dataclasses import dataclass

# How a row's pairs were obtained (``pairs_counted``): attnbench's closed form, the outside
# implementation's own (``pairs_source`` names it), counted from declared key sets by tiles or
# pair by pair, or not known (``flops_unknown`` says why).
PAIR_METHODS = ("closed-form", "declared", "blocks", "exact", "unknown")


@dataclass(frozen=True)
class Pairs:
    """A call's (query, key) pairs, useful and executed, and how they were obtained."""

    useful: int | None
    executed: int | None
    counted: str  # one of PAIR_METHODS
    source: str | None = None  # the implementation's own functions behind them, where it declared them
    unknown: str | None = None  # why they are not known (counted == "unknown")

    @classmethod
    def not_known(cls, why: str) -> Pairs:
        return cls(None, None, "unknown", unknown=why)


def pairs_of(impl, seq_len: int, heads: int, causal: bool) -> Pairs:
    """The pairs of ``impl`` at this shape, from what it declares (counting where it must)."""
    useful = impl.useful_pairs(seq_len, heads, causal)
    executed = impl.executed_pairs(seq_len, heads, causal)
    return Pairs(useful, executed, getattr(impl, "pairs_counted", None) or "closed-form", impl.pairs_source())


@dataclass
class Accounting:
    """A call's work, named as a row's fields (throughput only where it has a time; FLOPs only
    where its pairs are known)."""

    pairs_counted: str
    pairs_useful: int | None = None
    pairs_executed: int | None = None
    flops_useful: float | None = None
    flops_executed: float | None = None
    kept_fraction: float | None = None
    pairs_source: str | None = None
    flops_unknown: str | None = None
    tokens_per_s: float | None = None
    tflops_useful: float | None = None
    tflops_executed: float | None = None


def accounting(pairs: Pairs, wl, time_ms: float | None) -> Accounting:
    """The work of ``pairs`` on workload ``wl`` taking ``time_ms`` per call."""
    out = Accounting(pairs_counted=pairs.counted, pairs_source=pairs.source, flops_unknown=pairs.unknown)
    if time_ms:
        out.tokens_per_s = wl.batch * wl.seq_len / (time_ms / 1e3)
    if pairs.useful is None or pairs.executed is None:
        return out
    out.pairs_useful, out.pairs_executed = pairs.useful, pairs.executed
    out.flops_useful, out.flops_executed = wl.flops(pairs.useful), wl.flops(pairs.executed)
    out.kept_fraction = pairs.useful / (wl.heads * wl.seq_len**2)
    if time_ms:
        out.tflops_useful = out.flops_useful / (time_ms / 1e3) / 1e12
        out.tflops_executed = out.flops_executed / (time_ms / 1e3) / 1e12
    return out
