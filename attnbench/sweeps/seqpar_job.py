"""The rank side of sequence-parallel trials and reference checks: the rank jobs that
``attnbench.runtime.distributed.launch`` runs on every rank (``trial_job``, ``verify_job``),
named by ``attnbench.sweeps.seqpar`` as ``"module:function"``.

Every rank builds its own shard of the inputs, takes a barrier before each timed call and
times it. Ranks agree on the number of calls (from the slowest first call) so their
collectives line up. A rank that runs out of memory raises, and the launcher stops the
others. Memory is per GPU: each rank's allocator peaks and NVML on its own GPU.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from typing import Any

from attnbench.errors import ConfigError
from attnbench.impls import build_for_ranks as build
from attnbench.measure.core import MemoryProbe, Timer, measure_step
from attnbench.results.convert import fill
from attnbench.results.schema import GpuMemory
from attnbench.runtime.jobs import Place, job
from attnbench.sweeps.seqpar import Checked, RankChecks, RankMeasured, RankTrial
from attnbench.trials.measured import take_measurement
from attnbench.trials.ranks import agreement, phase_reporter, rank_device
from attnbench.trials.reference import TOLERANCE, Check, VerifyCase


def _maybe_fail(fail_rank: int | None, rank: int) -> None:
    """Fault injection for the tests: this rank raises while the others are already inside
    the ring waiting for it."""
    if fail_rank == rank:
        time.sleep(0.5)
        raise RuntimeError(f"rank {rank} was asked to fail")


@job
def verify_job(spec: RankChecks, place: Place) -> Checked:
    """Rank side of ``seqpar.verify``: rank 0 sends each case's check, the others nothing."""
    checks = []
    for item in spec.cases:
        started = time.monotonic()
        check = _verify_case(item.case, item.seed, place, spec.fail_rank)
        if place.rank == 0:
            checks.append(replace(check, elapsed_s=round(time.monotonic() - started, 3)))
    return Checked(checks)


def _verify_case(case: VerifyCase, seed: int, place: Place, fail_rank: int | None) -> Check | None:
    """The case's check on rank 0; None on the others, whose part ends with the gather."""
    import torch
    import torch.distributed as dist

    from attnbench.trials.reference import masked_reference, relative_error
    from attnbench.trials.workload import torch_dtype

    rank, world, dev = place.rank, place.world, rank_device(place)
    impl = build(case.impl, case.config, world)
    try:  # deterministic: every rank takes the same branch
        impl.check_shape(case.seq_len, case.heads)
        impl.check_causal(case.causal)
    except ConfigError as exc:
        return case.check(seed, "error", str(exc))
    gen = torch.Generator().manual_seed(seed)
    shape, kv_shape = case.shapes()
    # the same global inputs on every rank, rounded to the dtype so the reference sees what the ranks see
    q, k, v = (
        torch.randn(s, generator=gen, dtype=torch.float64).to(torch_dtype(case.dtype))
        for s in (shape, kv_shape, kv_shape)
    )
    positions = [impl.shard_positions(case.seq_len, r, case.causal) for r in range(world)]
    _maybe_fail(fail_rank, rank)
    with torch.no_grad():
        out = impl(*(x[:, positions[rank]].to(dev) for x in (q, k, v)), is_causal=case.causal)
    shards = [torch.empty(out.shape, dtype=torch.float32, device=dev) for _ in range(world)]
    dist.all_gather(shards, out.float().contiguous())
    if rank != 0:
        return None
    full = torch.empty(shape, dtype=torch.float32)
    for r in range(world):
        full[:, positions[r]] = shards[r].cpu()
    ref = masked_reference(q, k, v, impl.key_mask(case.seq_len, case.heads, causal=case.causal), device=dev)
    counterpart = impl.counterpart()
    with torch.no_grad():
        single = counterpart(q.to(dev), k.to(dev), v.to(dev), is_causal=case.causal).to("cpu", torch.float64)
    err, err_single = relative_error(full, ref), relative_error(full, single)
    tol = TOLERANCE[case.dtype]
    ok = err == err and err <= tol and err_single == err_single and err_single <= tol
    why = (
        ""
        if ok
        else (
            "relative error above tolerance"
            if err == err and err > tol
            else "differs from the single-device counterpart"
            if err == err
            else "non-finite output"
        )
    )
    return case.check(
        seed,
        "pass" if ok else "fail",
        why,
        rel_err=err,
        rel_err_single=err_single,
        counterpart=counterpart.name,
        backend=impl.last_backend,
        kv_layout=impl.last_kv_layout or None,
    )


@job
def trial_job(sent: RankTrial, place: Place) -> RankMeasured:
    """One rank of ``seqpar.run_trial``: its shard's calls timed in step with the other ranks,
    its memory, its GPU."""
    import torch

    from attnbench.measure.memory import CpuMemoryLimit, NvmlSampler, own_gpu_nvml
    from attnbench.trials.workload import Workload

    spec, rank, world, device = sent.spec, place.rank, place.world, place.device
    wl = spec.workload
    dev = rank_device(place)
    impl = build(wl.impl, wl.config, world)
    impl.check_shape(wl.seq_len, wl.heads)
    impl.check_causal(wl.causal)
    shard = Workload(**{**wl.to_dict(), "seq_len": wl.seq_len // world, "device": str(dev)})

    link_gbps = _link(dev, rank, world)  # before anything is allocated or sampled, freed after
    nvml, nvml_note = own_gpu_nvml(dev.index) if dev.type == "cuda" else (None, "")
    sampler = NvmlSampler(nvml)
    probe = MemoryProbe([dev.index] if dev.type == "cuda" else [])
    timer = Timer(device)
    r = RankMeasured(status="ok", message="", times_ms=[], timer=timer.name, link_gbps=link_gbps)
    r.nvml_note = nvml_note or None
    probe.start(spec.memory_limit)
    with sampler, CpuMemoryLimit(spec.memory_limit if dev.type == "cpu" else None):
        q, k, v = shard.make_inputs(torch.Generator(device=dev).manual_seed(spec.seed * 1009 + rank))
        r.inputs_bytes = probe.in_use()
        _maybe_fail(sent.fail_rank, rank)

        def step():
            with torch.no_grad():
                impl(q, k, v, is_causal=wl.causal)

        measured = measure_step(
            step,
            spec.policy(),
            timer,
            spec.max_trial_seconds,
            probe=probe,
            ranks=agreement(place),
            compiles=impl.compiles,
            gpu_timing=dev.type == "cuda" and impl.graph_capturable,
            after_call=impl.last_breakdown,
            phase=phase_reporter(place),
        )
        r.backend = impl.last_backend
        r.kv_layout = impl.last_kv_layout or None
    take_measurement(r, measured)  # statistics outside the memory limit (bootstrap imports numpy.random)
    _ring_breakdown(r, measured.per_call)
    fill(r, probe.peaks())
    if dev.type == "cuda":
        gpu = sampler.per_gpu()
        r.gpu = GpuMemory(
            **{**(gpu[0] if gpu else {}), "index": dev.index},
            rank=rank,
            cuda_device=dev.index,
            max_memory_allocated=r.max_memory_allocated,
            max_memory_reserved=r.max_memory_reserved,
        )
    return r


# bytes a rank sends to measure the link the ring runs on: enough to be bandwidth-bound
LINK_PROBE_BYTES = {"cuda": 256 << 20, "cpu": 8 << 20}


def _link(dev, rank: int, world: int) -> float | None:
    """The exchange bandwidth of these ranks' link (GB/s), measured before the trial."""
    if world < 2:
        return None
    import torch

    from attnbench.impls.sequence_parallel.engine import link_bandwidth_gbps

    gbps = link_bandwidth_gbps(dev, rank, world, LINK_PROBE_BYTES[dev.type])
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # its buffers leave nothing reserved behind
    return gbps


def _ring_breakdown(r: RankMeasured, per_call: list[dict[str, Any]]) -> None:
    """The median split of a timed call into compute and communication wait, and what the
    last call sent."""
    if not per_call:
        return
    r.compute_ms = statistics.median(b.get("compute_ms", 0.0) for b in per_call)
    r.comm_wait_ms = statistics.median(b.get("comm_wait_ms", 0.0) for b in per_call)
    r.sent_bytes = per_call[-1].get("sent_bytes")
    r.comm_steps = per_call[-1].get("comm_steps")
