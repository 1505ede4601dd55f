"""Which trials of two result sets are the same trial (identity keys), what device model a
row ran on, and how a trial is named in a finding."""

from __future__ import annotations

import json
from typing import Any

from attnbench import units
from attnbench.report.data import config_text, describe

WORKLOAD_KEYS = ("impl", "config", "batch", "seq_len", "heads", "head_dim", "dtype", "device", "mode", "causal")
VERIFY_KEYS = ("impl", "config", "batch", "seq_len", "heads", "head_dim", "causal", "dtype", "device")
ANY_CPU = "cpu (any model)"


def device_model(row: dict[str, Any], any_cpu: bool = False) -> str:
    """What a trial ran on: the GPU model for CUDA trials, the CPU model otherwise."""
    env = row.get("env") or {}
    if row.get("device") == "cuda":
        names = sorted({g.get("name", "?") for g in env.get("gpus") or []})
        return " + ".join(names) or env.get("machine") or "unknown GPU"
    return ANY_CPU if any_cpu else f"cpu: {env.get('cpu') or 'unknown'}"


def canon(row: dict[str, Any], keys: tuple[str, ...]) -> str:
    return json.dumps({k: row.get(k) for k in keys}, sort_keys=True, default=str)


def trial_identity(row: dict[str, Any]) -> str:
    return canon(
        {**row, "world_size": row.get("world_size", 1), "strategy": row.get("strategy", "single")},
        WORKLOAD_KEYS + ("world_size", "strategy"),
    )


def capacity_identity(row: dict[str, Any]) -> str:
    """A max-seq series: the workload but its length, and the limits that define capacity."""
    ident = {**row, "seq_len": None, "world_size": row.get("world_size", 1), "strategy": row.get("strategy", "single")}
    return canon(ident, WORKLOAD_KEYS + ("world_size", "strategy", "memory_limit", "max_trial_seconds"))


def short_tokens(n: int | None) -> str:
    """A length as the check shows it: exact ('2.875M'), 'none' when nothing ran."""
    return units.short_tokens(n, exact=True) if n else "none"


def describe_trial(row: dict[str, Any], with_len: bool = True) -> str:
    """A trial in a finding: the series' name as the report gives it, and its settings."""
    bits = [describe(row), row.get("dtype", "?"), f"B={row.get('batch')} H={row.get('heads')} D={row.get('head_dim')}"]
    if row.get("mode"):
        bits.append(row["mode"])
    if row.get("causal"):
        bits.append("causal")
    if row.get("world_size", 1) != 1:
        bits.append(f"{row['world_size']} GPUs {row.get('strategy', '')}".strip())
    if with_len:
        bits.append(f"N={short_tokens(row.get('seq_len'))}")
    return " ".join(bits)


def order(key: tuple[str, str]) -> tuple:
    """Series by series, each by length."""
    ident = json.loads(key[0])
    n = ident.pop("seq_len", None) or 0
    return json.dumps(ident, sort_keys=True), key[1], n


def verify_name(r: dict[str, Any]) -> str:
    cfg = config_text(r["config"], sep=" ")
    return (
        f"{r['impl']}{' ' + cfg if cfg else ''} {r['dtype']} B={r['batch']} N={r['seq_len']} H={r['heads']} "
        f"D={r['head_dim']}{' causal' if r.get('causal') else ''} on {r['device']}"
    )
