"""Sequence-parallel trials and reference checks, one process per rank under torchrun.

Parent side: ``run_trial(spec, world)`` measures a distributed implementation on ``world``
ranks and returns what they measured together (``schema.Measured``); ``verify(cases)`` checks cases gathered
across ranks against the float64 reference and the single-device counterpart.

A trial runs on the one executor of multi-rank trials (``attnbench.trials.placed``) with the
``ring`` strategy (``attnbench.trials.strategies.sequence``): every rank builds its own shard
of the inputs, takes a barrier before each timed call and times it; a call's time is the
slowest rank's, the row's ``time_ms`` the median over calls. Ranks agree on the number of
calls (from the slowest first call) so their collectives line up. A rank that runs out of
memory raises, the launcher stops the others, and ``agreed_status`` makes the trial "oom".
Memory is per GPU: each rank's allocator peaks and NVML on its own GPU. The reference check's
ranks run ``attnbench.sweeps.seqpar_verify``.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace

from attnbench import impls
from attnbench.analysis.ranks import slowest_of_all
from attnbench.errors import AttnbenchError
from attnbench.impls import build_for_ranks as build
from attnbench.results.schema import GpuMemory, Measured
from attnbench.runtime import nodes
from attnbench.runtime.distributed import agreed_status, launch
from attnbench.runtime.jobs import RankEnded
from attnbench.runtime.supervise import STARTUP_ALLOWANCE_S
from attnbench.trials.measured import set_peak, take_accounting
from attnbench.trials.placed import PlacedSpec, RankResult, merge
from attnbench.trials.placed import run as placed_trial
from attnbench.trials.reference import Check, VerifyCase
from attnbench.trials.trial import TrialSpec

#: the ``strategy`` of rows measured by sequence-parallel implementations, and where it is
STRATEGY = "ring"
STRATEGY_MODULE = "attnbench.trials.strategies.sequence"
# the reference check's rank job, by name (the job module imports this one)
VERIFY_JOB = "attnbench.sweeps.seqpar_verify:verify_job"


def is_distributed(name: str) -> bool:
    return impls.spec(name).distributed


def max_ranks(device: str) -> int:
    """GPUs visible on CUDA; on the CPU one gloo rank per core, at least 8 (so the paths of a
    node of 8 GPUs run on any machine, slowly); on every node of the run, each as this one."""
    if device == "cuda":
        import torch

        return torch.cuda.device_count() * nodes.current().count
    return max(8, os.cpu_count() or 1) * nodes.current().count


def contention(device: str, world: int) -> str | None:
    """Why a CPU trial's times are not what its ranks would take apart: more gloo ranks on a
    node than it has cores (allowed, so that the paths of a larger node run here; a speedup,
    whose answer is a time, refuses it)."""
    cores = os.cpu_count() or 1
    per_node = -(-world // nodes.current().count)
    if device != "cpu" or per_node <= cores:
        return None
    return (
        f"{per_node} gloo ranks share {cores} cores: their times include waiting for a core, so they do "
        "not show how the ranks scale (outputs, bytes sent and memory per rank are unaffected)"
    )


def check_world(device: str, world: int) -> None:
    if world < 1:
        raise AttnbenchError(f"--gpus {world}: give a positive number of ranks")
    limit = max_ranks(device)
    if world > limit:
        count = nodes.current().count
        if device == "cuda" and count > 1:
            raise AttnbenchError(
                f"--gpus {world}: {limit // count} CUDA GPU(s) visible on each of {count} nodes; "
                f"choose --gpus {limit} or fewer"
            )
        if device == "cuda":
            raise AttnbenchError(f"--gpus {world}: only {limit} CUDA GPU(s) visible; choose --gpus {limit} or fewer")
        raise AttnbenchError(
            f"--gpus {world}: on the CPU at most {limit} gloo ranks (one per core, at least 8); "
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


@dataclass
class SeededCase:
    case: VerifyCase
    seed: int  # the inputs' generator seed, the same on every rank


@dataclass
class RankChecks:
    """What every rank of a reference check is given: the cases of one world size and device."""

    cases: list[SeededCase]
    fail_rank: int | None = None


@dataclass
class Checked:
    """What a reference check's rank 0 sends back (the other ranks nothing)."""

    checks: list[Check]


def run_trial(spec: TrialSpec, world: int, fail_rank: int | None = None) -> Measured:
    """One trial on ``world`` ranks: what they measured together (status, times, memory per GPU, ranks)."""
    wl = spec.workload
    placed = PlacedSpec(
        strategy=STRATEGY,
        strategy_module=STRATEGY_MODULE,
        workload=wl,
        seed=spec.seed,
        timing=spec.policy(),
        limit_s=spec.max_trial_seconds,
        memory_limit=spec.memory_limit,
        gpus=world,
        fail_rank=fail_rank,
    )
    ended = placed_trial(
        placed, wl.device, launch, phase_limit_s=spec.max_trial_seconds, memory_limit=spec.memory_limit
    )
    return combine(ended, wl, world)


def combine(ended: list[RankEnded], wl, world: int) -> Measured:
    """One trial row's measured part from how its ranks ended (``placed.merge``: each call's
    time the slowest rank's), each memory reading the fullest rank's, the ring's traffic."""
    m = Measured(status="error", message="", times_ms=[])
    merge(m, ended)
    # a rank that measured (a time-limit included) sent its part; one the launcher saw fail did not
    sent = [(e.rank, e.result) for e in ended if e.result is not None]
    ranks = [r for _, r in sent]
    m.compile_ms = slowest_of_all([r.compile_ms for r in ranks], world)
    m.sent_bytes, m.algbw_gbps = traffic(ranks, m.time_ms)
    links = [r.link_gbps for r in ranks if r.link_gbps is not None]
    m.link_gbps = min(links) if links else None  # every rank has the slowest rank's time
    m.gpus = [rank_gpu(rank, r) for rank, r in sent if r.devices]
    for name in (
        "max_memory_allocated",
        "max_memory_reserved",
        "cpu_peak_rss_delta",
        "inputs_bytes",
        "device_total_bytes",
    ):
        values = [getattr(r, name) for r in ranks if getattr(r, name) is not None]
        setattr(m, name, max(values) if values else None)  # per GPU: the fullest rank
    # per GPU: the rank's shard of q, k, v and the output
    set_peak(m, wl.device == "cuda", wl.floor_bytes // world, " (max over ranks)")
    take_accounting(m, build(wl.impl, wl.config, world), wl)
    return m


def rank_gpu(rank: int, r: RankResult) -> GpuMemory:
    """A rank's own GPU: NVML's reading beside its allocator peaks."""
    (device,) = r.devices
    seen = r.nvml[0] if r.nvml else GpuMemory(index=device)
    return replace(
        seen,
        rank=rank,
        cuda_device=device,
        max_memory_allocated=r.max_memory_allocated,
        max_memory_reserved=r.max_memory_reserved,
    )


def traffic(ranks: list[RankResult], time_ms: float | None) -> tuple[int | None, float | None]:
    """Bytes the busiest rank sends per call and its achieved bandwidth over the whole call,
    nccl-tests' algbw (bytes / time, GB/s = 1e9 B/s): what the ring really moved, comparable
    with the link's measured bandwidth. One rank sends nothing: 0 bytes, no bandwidth."""
    sent = [r.sent_bytes for r in ranks if r.sent_bytes is not None]
    if not sent:
        return None, None
    busiest = max(sent)
    return busiest, (busiest / (time_ms / 1e3) / 1e9 if busiest and time_ms else None)


def verify(cases: list[VerifyCase], fail_rank: int | None = None) -> list[tuple[VerifyCase, Check]]:
    """Run the cases, one launch per (world size, device); each case with its check, launch by launch."""
    groups: dict[tuple[int, str], list[VerifyCase]] = {}
    for c in cases:
        groups.setdefault((c.world_size, c.device), []).append(c)
    checked: list[tuple[VerifyCase, Check]] = []
    for (world, device), group in groups.items():
        check_world(device, world)
        seeds = [random.randrange(2**31 - 1) for _ in group]
        spec = RankChecks([SeededCase(c, s) for c, s in zip(group, seeds)], fail_rank)
        ended = launch(VERIFY_JOB, spec, world, device, phase_limit_s=STARTUP_ALLOWANCE_S)
        status, message = agreed_status(ended)
        if status == "ok":
            checks = ended[0].result.checks
        else:  # the run ended on a failing rank: every case of it is an error with that rank's reason
            checks = [c.check(seed, "error", message) for c, seed in zip(group, seeds)]
        checked += zip(group, checks)
    return checked
