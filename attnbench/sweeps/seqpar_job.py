"""The rank side of sequence-parallel trials and reference checks: the job functions that
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
from dataclasses import asdict
from typing import Any

from attnbench.errors import ConfigError
from attnbench.impls import build_for_ranks as build
from attnbench.measure.probe import MemoryProbe
from attnbench.reference import TOLERANCE, VerifyCase
from attnbench.sweeps.seqpar import case_row
from attnbench.trial import TrialSpec


def _device(device: str):
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")


def _maybe_fail(payload: dict[str, Any], rank: int) -> None:
    """Fault injection for the tests: this rank raises while the others are already inside
    the ring waiting for it."""
    if payload.get("fail_rank") == rank:
        time.sleep(0.5)
        raise RuntimeError(f"rank {rank} was asked to fail")


def verify_job(payload: dict[str, Any], rank: int, world: int, device: str) -> dict[str, Any]:
    rows = []
    for item in payload["cases"]:
        rows.append(_verify_case(VerifyCase(**item["case"]), item["seed"], rank, world, _device(device), payload))
    return {"rows": rows if rank == 0 else []}


def _verify_case(case: VerifyCase, seed: int, rank: int, world: int, dev, payload) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from attnbench.reference import masked_reference, relative_error
    from attnbench.workload import DTYPES

    row = case_row(asdict(case), seed)
    impl = build(case.impl, case.config, world)
    try:  # deterministic: every rank takes the same branch
        impl.check_shape(case.seq_len, case.heads)
        impl.check_causal(case.causal)
    except ConfigError as exc:
        return {**row, "status": "error", "rel_err": None, "rel_err_single": None, "message": str(exc)}
    gen = torch.Generator().manual_seed(seed)
    shape, kv_shape = case.shapes()
    # the same global inputs on every rank, rounded to the dtype so the reference sees what the ranks see
    q, k, v = (
        torch.randn(s, generator=gen, dtype=torch.float64).to(DTYPES[case.dtype]) for s in (shape, kv_shape, kv_shape)
    )
    positions = [impl.shard_positions(case.seq_len, r, case.causal) for r in range(world)]
    _maybe_fail(payload, rank)
    with torch.no_grad():
        out = impl(*(x[:, positions[rank]].to(dev) for x in (q, k, v)), is_causal=case.causal)
    shards = [torch.empty(out.shape, dtype=torch.float32, device=dev) for _ in range(world)]
    dist.all_gather(shards, out.float().contiguous())
    if rank != 0:
        return row
    full = torch.empty(shape, dtype=torch.float32)
    for r in range(world):
        full[:, positions[r]] = shards[r].cpu()
    ref = masked_reference(q, k, v, impl.key_mask(case.seq_len, case.heads, causal=case.causal))
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
    return {
        **row,
        "status": "pass" if ok else "fail",
        "rel_err": err,
        "rel_err_single": err_single,
        "counterpart": counterpart.name,
        "backend": impl.last_backend,
        **({"kv_layout": impl.last_kv_layout} if impl.last_kv_layout else {}),
        "message": why,
    }


def trial_job(payload: dict[str, Any], rank: int, world: int, device: str) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from attnbench.measure.memory import CpuMemoryLimit, NvmlSampler
    from attnbench.measure.timing import Timer, plan_calls
    from attnbench.workload import Workload

    spec = TrialSpec(**payload["spec"])
    wl = Workload(**spec.workload)
    dev = _device(device)
    impl = build(wl.impl, wl.config, world)
    impl.check_shape(wl.seq_len, wl.heads)
    impl.check_causal(wl.causal)
    shard = Workload(**{**wl.to_dict(), "seq_len": wl.seq_len // world, "device": str(dev)})

    def phase(name: str) -> None:
        if rank == 0:  # the launcher's supervisor reads these from torchrun's stdout
            print(f"phase {name}", flush=True)

    nvml, nvml_note = _own_gpu_nvml(dev) if dev.type == "cuda" else (None, "")
    sampler = NvmlSampler(nvml)
    probe = _RankMemory(dev)
    timer = Timer(device)
    row: dict[str, Any] = {"timer": timer.name, "times_ms": []}
    if nvml_note:
        row["nvml_note"] = nvml_note
    probe.start(spec.memory_limit)
    with sampler, CpuMemoryLimit(spec.memory_limit if dev.type == "cpu" else None):
        q, k, v = shard.make_inputs(torch.Generator(device=dev).manual_seed(spec.seed * 1009 + rank))
        row["inputs_bytes"] = probe.in_use()
        _maybe_fail(payload, rank)

        def step():
            with torch.no_grad():
                impl(q, k, v, is_causal=wl.causal)

        if impl.compiles:  # a compiled kernel's first call pays for compilation: record it apart
            phase("compile")
            dist.barrier()
            row["compile_ms"] = timer(step)
        phase("first-call")
        dist.barrier()
        row["first_call_ms"] = timer(step)
        slowest = torch.tensor([row["first_call_ms"]], dtype=torch.float64, device=dev)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # every rank plans the same number of calls
        slowest_ms = float(slowest.item())
        if slowest_ms > spec.max_trial_seconds * 1e3:
            row.update(
                status="time-limit", message=f"one call took {slowest_ms / 1e3:.1f} s > {spec.max_trial_seconds:g} s"
            )
        else:
            phase("timing")
            row.update(_timed_calls(impl, step, timer, plan_calls(slowest_ms, spec.policy())), status="ok")
        row["backend"] = impl.last_backend
        row["kv_layout"] = impl.last_kv_layout
    row.update(probe.peaks())
    gpu = sampler.per_gpu()
    if dev.type == "cuda":
        entry = {
            **(gpu[0] if gpu else {}),
            "rank": rank,
            "cuda_device": dev.index,
            "max_memory_allocated": row.get("max_memory_allocated"),
            "max_memory_reserved": row.get("max_memory_reserved"),
        }
        entry["index"] = getattr(nvml, "index", dev.index)
        row["gpu"] = entry
    return row


def _timed_calls(impl, step, timer, plan: tuple[int, int]) -> dict[str, Any]:
    """Warm-up then timed calls, every call after a barrier so all ranks start together; the
    rank's times and its median split of each call into compute and communication wait."""
    import torch.distributed as dist

    warmup, calls = plan
    for _ in range(warmup):
        dist.barrier()
        step()
    times, breakdowns = [], []
    for _ in range(calls):
        dist.barrier()
        times.append(timer(step))
        breakdowns.append(impl.last_breakdown())
    out: dict[str, Any] = {"times_ms": times}
    for key in ("compute_ms", "comm_wait_ms"):
        out[key] = statistics.median(b.get(key, 0.0) for b in breakdowns)
    out["sent_bytes"] = breakdowns[-1].get("sent_bytes")
    out["comm_steps"] = breakdowns[-1].get("comm_steps")
    return out


class _OneGpu:
    """An NVML backend restricted to the rank's own GPU."""

    def __init__(self, backend, index: int) -> None:
        self.backend, self.index = backend, index

    def device_count(self) -> int:
        return 1

    def used_bytes(self, index: int) -> int:
        return self.backend.used_bytes(self.index)


def _own_gpu_nvml(dev):
    """NVML for this rank's GPU, matched by UUID (CUDA and NVML may number GPUs differently)."""
    import torch

    from attnbench.measure.memory import open_nvml

    backend, note = open_nvml()
    if backend is None:
        return None, note
    index = dev.index
    try:
        import pynvml

        uuid = str(torch.cuda.get_device_properties(dev).uuid)
        for i, handle in enumerate(backend._handles):
            name = pynvml.nvmlDeviceGetUUID(handle)
            if (name.decode() if isinstance(name, bytes) else name).endswith(uuid):
                index = i
                break
    except Exception:  # keep the CUDA index: right unless CUDA_VISIBLE_DEVICES reorders GPUs
        pass
    return _OneGpu(backend, index), ""


class _RankMemory:
    """Allocator peaks of the rank's own GPU (reset per trial), resident set on the CPU."""

    def __init__(self, dev) -> None:
        self.dev = dev
        self.cpu = MemoryProbe(cuda=False) if dev.type == "cpu" else None
        self.base = 0

    def start(self, limit: int | None) -> None:
        import torch

        if self.cpu:
            return self.cpu.start(limit)
        torch.cuda.empty_cache()
        if limit:
            total = torch.cuda.get_device_properties(self.dev).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), self.dev)
        torch.cuda.reset_peak_memory_stats(self.dev)
        self.base = torch.cuda.memory_allocated(self.dev)

    def in_use(self) -> int:
        import torch

        return self.cpu.in_use() if self.cpu else torch.cuda.memory_allocated(self.dev) - self.base

    def peaks(self) -> dict[str, Any]:
        import torch

        if self.cpu:
            return self.cpu.peaks()
        return {
            "max_memory_allocated": torch.cuda.max_memory_allocated(self.dev),
            "max_memory_reserved": torch.cuda.max_memory_reserved(self.dev),
            "device_total_bytes": torch.cuda.get_device_properties(self.dev).total_memory,
        }
