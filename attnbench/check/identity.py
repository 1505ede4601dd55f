"""Which rows of two result sets are the same trial, what device model a row ran on, and how a
trial is named in a finding. Identities come from the rows' own workload fields
(``Workload.identity_key``), so a workload field added to the schema joins them."""

from __future__ import annotations

import json

from attnbench import units
from attnbench.report.data import config_text
from attnbench.results.schema import Trial, Workload

ANY_CPU = "cpu (any model)"


def device_model(row: Workload, any_cpu: bool = False) -> str:
    """What a row ran on: the GPU model for CUDA rows, the CPU model otherwise."""
    env = row.env
    if row.device == "cuda":
        names = sorted({str(g.get("name", "?")) for g in (env.gpus if env else None) or []})
        return " + ".join(names) or (env.machine if env else "") or "unknown GPU"
    return ANY_CPU if any_cpu else f"cpu: {(env.cpu if env else None) or 'unknown'}"


def capacity_identity(row: Trial) -> str:
    """A max-seq search: the workload but its length, and the limits that define capacity."""
    return row.identity_key(seq_len=False, memory_limit=row.memory_limit, max_trial_seconds=row.max_trial_seconds)


def short_tokens(n: int | None) -> str:
    """A length as the check shows it: exact ('2.875M'), 'none' when nothing ran."""
    return units.short_tokens(n, exact=True) if n else "none"


def describe_trial(row: Workload, with_len: bool = True) -> str:
    """A trial in a finding: the series' name as the tables give it, and its settings."""
    label = getattr(row, "label", None) or f"{row.impl}({config_text(row.config)})"
    bits = [label, row.dtype, f"B={row.batch} H={row.heads} D={row.head_dim}"]
    if row.mode:
        bits.append(row.mode)
    if row.causal:
        bits.append("causal")
    if (row.world_size or 1) != 1:
        bits.append(f"{row.world_size} GPUs {row.strategy or ''}".strip())
    if with_len:
        bits.append(f"N={short_tokens(row.seq_len)}")
    return " ".join(bits)


def order(key: tuple[str, str]) -> tuple:
    """Series by series, each by length."""
    ident = json.loads(key[0])
    n = ident.pop("seq_len", None) or 0
    return json.dumps(ident, sort_keys=True), key[1], n


def verify_name(r: Workload) -> str:
    cfg = config_text(r.config, sep=" ")
    return (
        f"{r.impl}{' ' + cfg if cfg else ''} {r.dtype} B={r.batch} N={r.seq_len} H={r.heads} "
        f"D={r.head_dim}{' causal' if r.causal else ''}{' ' + r.mode if r.mode else ''} on {r.device}"
    )
