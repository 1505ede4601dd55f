"""The reference check, as every command runs it (`verify`, `run`/`max-seq`/`bench`, `speedup`).

Cases of one-device implementations run in a child process when any is on the GPU (so the
parent never holds a CUDA context while it later supervises trials), else in this process;
sequence-parallel cases run across ranks under torchrun, against the float64 reference and
their single-device counterpart. Rows come back in case order: one-device cases first.
"""

from __future__ import annotations

from typing import Any

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.reference import VerifyCase, run_case
from attnbench.trial import run_verify_isolated


def run_reference_checks(
    cases: list[VerifyCase], isolate: bool = False, memory_limit: int | None = None, warm: bool = False
) -> list[dict[str, Any]]:
    """One verify row (without run and env) per case; ``isolate`` runs the one-device cases in
    a child under ``memory_limit`` like a trial (always on the GPU); ``warm``: trials in worker
    processes follow (the first one's process starts meanwhile)."""
    ranked = [c for c in cases if impls.spec(c.impl).distributed]
    single = [c for c in cases if not impls.spec(c.impl).distributed]
    if isolate or any(c.device == "cuda" for c in single):
        rows = run_verify_isolated(single, memory_limit, warm=warm)
    else:
        rows = [run_case(c) for c in single]
    if ranked:
        from attnbench.sweeps import seqpar  # torchrun machinery, only where a case needs ranks

        rows += seqpar.verify(ranked)
    return rows


def config_text(config: dict[str, Any]) -> str:
    """A configuration as one key: sorted, so a check row and a series compare equal."""
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items()))


def refuse_unrunnable(rows: list[dict[str, Any]]) -> None:
    """A case that cannot run at all (a dtype a backend lacks, say) is bad input, not a failed check."""
    for row in rows:
        if row["status"] == "error":
            raise AttnbenchError(
                f"{row['impl']} {config_text(row['config'])} cannot run {row['dtype']} on {row['device']}: "
                f"{row['message']}; choose another --dtype, backend or configuration"
            )
