"""Sequence-parallel trials and reference checks, one process per rank under torchrun.

Parent side: ``run_trial(spec, world)`` measures a distributed implementation on ``world``
ranks and returns the fields of one result row; ``verify(cases)`` checks cases gathered
across ranks against the float64 reference and the single-device counterpart.

Rank side (``attnbench.sweeps.seqpar_job``, the job functions that
``attnbench.runtime.distributed.launch`` runs): every rank builds its own shard of the
inputs, takes a barrier before each timed call and times it; a call's time is the slowest
rank's, the row's ``time_ms`` the median over calls. Ranks agree on the number of calls
(from the slowest first call) so their collectives line up. A rank that runs out of memory
raises, the launcher stops the others, and ``agreed_status`` makes the trial "oom". Memory
is per GPU: each rank's allocator peaks and NVML on its own GPU.
"""

from __future__ import annotations

import os
import random
import statistics
from dataclasses import asdict
from typing import Any

from attnbench import impls
from attnbench.errors import AttnbenchError
from attnbench.impls import build_for_ranks as build
from attnbench.measure.accounting import accounting
from attnbench.results.schema import Fields
from attnbench.runtime.distributed import agreed_status, launch
from attnbench.runtime.supervise import STARTUP_ALLOWANCE_S
from attnbench.trials.reference import Check, VerifyCase
from attnbench.trials.trial import TrialSpec

#: the ``strategy`` of rows measured by sequence-parallel implementations
STRATEGY = "ring"
# the rank side's job functions, by name (the job module imports this one)
TRIAL_JOB = "attnbench.sweeps.seqpar_job:trial_job"
VERIFY_JOB = "attnbench.sweeps.seqpar_job:verify_job"


def is_distributed(name: str) -> bool:
    return impls.spec(name).distributed


def max_ranks(device: str) -> int:
    """GPUs visible on CUDA; on the CPU one gloo rank per core, at least 4 (so the 4-rank
    paths run on any machine)."""
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return max(4, os.cpu_count() or 1)


def check_world(device: str, world: int) -> None:
    if world < 1:
        raise AttnbenchError(f"--gpus {world}: give a positive number of ranks")
    limit = max_ranks(device)
    if world > limit:
        if device == "cuda":
            raise AttnbenchError(f"--gpus {world}: only {limit} CUDA GPU(s) visible; choose --gpus {limit} or fewer")
        raise AttnbenchError(
            f"--gpus {world}: on the CPU at most {limit} gloo ranks (one per core, at least 4); "
            f"choose --gpus {limit} or fewer"
        )


def check_modes(name: str, mode: str, causal: bool, impl) -> None:
    modes = impls.spec(name).extra.get("modes")
    if modes and mode not in modes:
        raise AttnbenchError(f"{name} runs {', '.join(modes)} only; use --mode {modes[0]}")
    if causal and not impl.supports_causal:
        raise AttnbenchError(
            f"{name} {'with this configuration ' if name == 'dilated' else ''}runs non-causal only "
            "(a 2-D grid has no causal order); drop --causal"
        )


# ---------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------


def run_trial(spec: TrialSpec, world: int, fail_rank: int | None = None) -> Fields:
    """One trial on ``world`` ranks; the row fields (status, times, memory per GPU, ranks)."""
    from attnbench.trials.workload import Workload

    wl = Workload(**spec.workload)
    payload = {"spec": asdict(spec), "fail_rank": fail_rank}
    results = launch(
        TRIAL_JOB, payload, world, wl.device, phase_limit_s=spec.max_trial_seconds, memory_limit=spec.memory_limit
    )
    return combine(results, wl, world)


def combine(results: list[dict[str, Any]], wl, world: int) -> Fields:
    """One row from the ranks' results: each call's time is the slowest rank's."""
    from attnbench.measure.timing import sample_statistics

    status, message = agreed_status(results)
    row: Fields = {"status": status, "message": message, "times_ms": []}
    samples = [r.get("times_ms") or [] for r in results]
    if status == "ok" and all(samples):
        row["times_ms"] = [max(call) for call in zip(*samples)]
    row.update(vars(sample_statistics(row["times_ms"])))
    firsts = [r["first_call_ms"] for r in results if r.get("first_call_ms") is not None]
    row["first_call_ms"] = max(firsts) if len(firsts) == world else None
    compiles = [r["compile_ms"] for r in results if r.get("compile_ms") is not None]
    if len(compiles) == world:
        row["compile_ms"] = max(compiles)
    row["ranks"] = [_rank_summary(r) for r in results]
    row.update(traffic(row["ranks"], row.get("time_ms")))
    links = [r["link_gbps"] for r in results if r.get("link_gbps") is not None]
    if links:
        row["link_gbps"] = min(links)  # every rank has the slowest rank's time
    row["gpus"] = [r["gpu"] for r in results if r.get("gpu")]
    if any(r.get("nvml_note") for r in results):
        row["nvml_note"] = next(r["nvml_note"] for r in results if r.get("nvml_note"))
    for key in (
        "max_memory_allocated",
        "max_memory_reserved",
        "cpu_peak_rss_delta",
        "inputs_bytes",
        "device_total_bytes",
    ):
        values = [r[key] for r in results if r.get(key) is not None]
        if values:
            row[key] = max(values)  # per GPU: the fullest rank
    row["backend"] = next((r.get("backend") for r in results if r.get("backend")), None)
    layout = next((r["kv_layout"] for r in results if r.get("kv_layout")), None)
    if layout:  # grouped K/V: shared, or copied to every query head
        row["kv_layout"] = layout
    row["timer"] = next((r.get("timer") for r in results if r.get("timer")), None)
    cuda = wl.device == "cuda"
    peak = row.get("max_memory_allocated") if cuda else row.get("cpu_peak_rss_delta")
    row["peak_bytes"] = peak
    row["peak_counter"] = ("cuda.max_memory_allocated" if cuda else "cpu.peak_rss_delta") + " (max over ranks)"
    row["floor_bytes"] = wl.floor_bytes // world  # per GPU: the rank's shard of q, k, v and the output
    row["peak_over_floor"] = peak / row["floor_bytes"] if peak else None
    impl = build(wl.impl, wl.config, world)
    row.update(accounting(impl, wl, row.get("time_ms")))
    return row


def traffic(ranks: list[dict[str, Any]], time_ms: float | None) -> Fields:
    """Bytes the busiest rank sends per call and its achieved bandwidth over the whole call,
    nccl-tests' algbw (bytes / time, GB/s = 1e9 B/s): what the ring really moved, comparable
    with the link's measured bandwidth. One rank sends nothing: 0 bytes, no bandwidth."""
    sent = [r["sent_bytes"] for r in ranks if r.get("sent_bytes") is not None]
    if not sent:
        return {"sent_bytes": None, "algbw_gbps": None}
    busiest = max(sent)
    bandwidth = busiest / (time_ms / 1e3) / 1e9 if busiest and time_ms else None
    return {"sent_bytes": busiest, "algbw_gbps": bandwidth}


def _rank_summary(r: dict[str, Any]) -> dict[str, Any]:
    times = r.get("times_ms") or []
    keep = (
        "rank",
        "status",
        "message",
        "compile_ms",
        "first_call_ms",
        "compute_ms",
        "comm_wait_ms",
        "sent_bytes",
        "comm_steps",
        "max_memory_allocated",
        "max_memory_reserved",
        "cpu_peak_rss_delta",
        "inputs_bytes",
    )
    out = {k: r.get(k) for k in keep if r.get(k) is not None}
    out["time_ms"] = statistics.median(times) if times else None
    if r.get("status") == "ok":
        out.pop("message", None)
    return out


def verify(cases: list[VerifyCase], fail_rank: int | None = None) -> list[tuple[VerifyCase, Check]]:
    """Run the cases, one launch per (world size, device); each case with its check, launch by launch."""
    from attnbench.results.schema import received

    groups: dict[tuple[int, str], list[VerifyCase]] = {}
    for c in cases:
        groups.setdefault((c.world_size, c.device), []).append(c)
    checked: list[tuple[VerifyCase, Check]] = []
    for (world, device), group in groups.items():
        check_world(device, world)
        seeds = [random.randrange(2**31 - 1) for _ in group]
        payload = {"cases": [{"case": asdict(c), "seed": s} for c, s in zip(group, seeds)], "fail_rank": fail_rank}
        results = launch(VERIFY_JOB, payload, world, device, phase_limit_s=STARTUP_ALLOWANCE_S)
        status, message = agreed_status(results)
        if status == "ok":
            checks = [received(Check, check, "rank 0 of the reference check") for check in results[0]["checks"]]
        else:  # the run ended on a failing rank: every case of it is an error with that rank's reason
            checks = [c.check(seed, "error", message) for c, seed in zip(group, seeds)]
        checked += zip(group, checks)
    return checked
