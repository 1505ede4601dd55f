"""Sequence-parallel trials and reference checks, one process per rank under torchrun.

Parent side: ``run_trial(spec, world)`` measures a distributed implementation on ``world``
ranks and returns the fields of one result row; ``verify(cases)`` checks cases gathered
across ranks against the float64 reference and the single-device counterpart.

Rank side (job functions that ``attnbench.runtime.distributed.launch`` runs): every rank builds its own shard of
the inputs, takes a barrier before each timed call and times it; a call's time is the
slowest rank's, the row's ``time_ms`` the median over calls. Ranks agree on the number of
calls (from the slowest first call) so their collectives line up. A rank that runs out of
memory raises, the launcher stops the others, and ``agreed_status`` makes the trial "oom".
Memory is per GPU: each rank's allocator peaks and NVML on its own GPU.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import asdict
from typing import Any

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.impls import build_for_ranks as build
from attnbench.measure.accounting import accounting
from attnbench.measure.probe import MemoryProbe
from attnbench.reference import TOLERANCE, VerifyCase
from attnbench.runtime.distributed import agreed_status, launch
from attnbench.runtime.supervise import STARTUP_ALLOWANCE_S
from attnbench.trial import TrialSpec

#: the ``strategy`` of rows measured by sequence-parallel implementations
STRATEGY = "ring"


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
        raise AttnbenchError(f"--gpus {world}: on the CPU at most {limit} gloo ranks (one per core, at least 4); "
                             f"choose --gpus {limit} or fewer")


def check_modes(name: str, mode: str, causal: bool, impl) -> None:
    modes = impls.spec(name).extra.get("modes")
    if modes and mode not in modes:
        raise AttnbenchError(f"{name} runs {', '.join(modes)} only; use --mode {modes[0]}")
    if causal and not impl.supports_causal:
        raise AttnbenchError(f"{name} {'with this configuration ' if name == 'dilated' else ''}runs non-causal only "
                             "(a 2-D grid has no causal order); drop --causal")


# ---------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------

def run_trial(spec: TrialSpec, world: int, fail_rank: int | None = None) -> dict[str, Any]:
    """One trial on ``world`` ranks; the row fields (status, times, memory per GPU, ranks)."""
    from attnbench.workload import Workload

    wl = Workload(**spec.workload)
    payload = {"spec": asdict(spec), "fail_rank": fail_rank}
    results = launch(trial_job, payload, world, wl.device, phase_limit_s=spec.max_trial_seconds)
    return combine(results, wl, world)


def combine(results: list[dict[str, Any]], wl, world: int) -> dict[str, Any]:
    """One row from the ranks' results: each call's time is the slowest rank's."""
    from attnbench.measure.timing import summarize

    status, message = agreed_status(results)
    row: dict[str, Any] = {"status": status, "message": message, "times_ms": []}
    samples = [r.get("times_ms") or [] for r in results]
    if status == "ok" and all(samples):
        row["times_ms"] = [max(call) for call in zip(*samples)]
    row.update(summarize(row["times_ms"]))
    firsts = [r["first_call_ms"] for r in results if r.get("first_call_ms") is not None]
    row["first_call_ms"] = max(firsts) if len(firsts) == world else None
    compiles = [r["compile_ms"] for r in results if r.get("compile_ms") is not None]
    if len(compiles) == world:
        row["compile_ms"] = max(compiles)
    row["ranks"] = [_rank_summary(r) for r in results]
    row.update(traffic(row["ranks"], row.get("time_ms")))
    row["gpus"] = [r["gpu"] for r in results if r.get("gpu")]
    if any(r.get("nvml_note") for r in results):
        row["nvml_note"] = next(r["nvml_note"] for r in results if r.get("nvml_note"))
    for key in ("max_memory_allocated", "max_memory_reserved", "cpu_peak_rss_delta", "inputs_bytes", "device_total_bytes"):
        values = [r[key] for r in results if r.get(key) is not None]
        if values:
            row[key] = max(values)  # per GPU: the fullest rank
    row["backend"] = next((r.get("backend") for r in results if r.get("backend")), None)
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


def traffic(ranks: list[dict[str, Any]], time_ms: float | None) -> dict[str, Any]:
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
    keep = ("rank", "status", "message", "compile_ms", "first_call_ms", "compute_ms", "comm_wait_ms", "sent_bytes", "comm_steps",
            "max_memory_allocated", "max_memory_reserved", "cpu_peak_rss_delta", "inputs_bytes")
    out = {k: r.get(k) for k in keep if r.get(k) is not None}
    out["time_ms"] = statistics.median(times) if times else None
    if r.get("status") == "ok":
        out.pop("message", None)
    return out


def cases_for(name: str, device: str, dtypes: list[str], world: int) -> list[VerifyCase]:
    """Like reference.default_cases, on ``world`` ranks: two shapes per configuration (B > 1,
    head counts that do not divide into groups), causal where it means something."""
    entry = impls.spec(name)
    configs = entry.verify_configs(device) if callable(entry.verify_configs) else entry.verify_configs
    cases = []
    for config in configs:
        impl = build(name, config, world)
        n = impl.verify_seq_len()
        for batch, seq_len, heads, head_dim in ((2, n, 5, 16), (1, 2 * n, 3, 32)):
            for causal in (False, True) if impl.supports_causal else (False,):
                for dtype in dtypes:
                    cases.append(VerifyCase(name, impl.config(), batch, seq_len, heads, head_dim, causal, dtype,
                                            device, world))
    return cases


def verify(cases: list[VerifyCase], fail_rank: int | None = None) -> list[dict[str, Any]]:
    """Run the cases, one launch per (world size, device); verify rows in case order."""
    groups: dict[tuple[int, str], list[VerifyCase]] = {}
    for c in cases:
        groups.setdefault((c.world_size, c.device), []).append(c)
    rows: list[dict[str, Any]] = []
    for (world, device), group in groups.items():
        check_world(device, world)
        payload = {"cases": [{"case": asdict(c), "seed": random.randrange(2**31 - 1)} for c in group],
                   "fail_rank": fail_rank}
        results = launch(verify_job, payload, world, device, phase_limit_s=STARTUP_ALLOWANCE_S)
        status, message = agreed_status(results)
        if status == "ok":
            rows.extend(results[0]["rows"])
        else:  # the run ended on a failing rank: every case of it is an error with that rank's reason
            rows.extend({**_case_row(p["case"], p["seed"]), "status": "error", "rel_err": None, "rel_err_single": None,
                         "message": message} for p in payload["cases"])
    return rows


def _case_row(case: dict[str, Any], seed: int) -> dict[str, Any]:
    return {"kind": "verify", "impl": case["impl"], "config": case["config"], "batch": case["batch"],
            "seq_len": case["seq_len"], "heads": case["heads"], "head_dim": case["head_dim"], "causal": case["causal"],
            "dtype": case["dtype"], "device": case["device"], "world_size": case["world_size"], "seed": seed,
            "tolerance": TOLERANCE[case["dtype"]], "strategy": STRATEGY}


# ---------------------------------------------------------------------------------------
# Rank side
# ---------------------------------------------------------------------------------------

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

    row = _case_row(asdict(case), seed)
    impl = build(case.impl, case.config, world)
    try:  # deterministic: every rank takes the same branch
        impl.check_shape(case.seq_len, case.heads)
        impl.check_causal(case.causal)
    except ConfigError as exc:
        return {**row, "status": "error", "rel_err": None, "rel_err_single": None, "message": str(exc)}
    gen = torch.Generator().manual_seed(seed)
    shape = (case.batch, case.seq_len, case.heads, case.head_dim)
    # the same global inputs on every rank, rounded to the dtype so the reference sees what the ranks see
    q, k, v = (torch.randn(shape, generator=gen, dtype=torch.float64).to(DTYPES[case.dtype]) for _ in range(3))
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
    why = "" if ok else ("relative error above tolerance" if err == err and err > tol else
                         "differs from the single-device counterpart" if err == err else "non-finite output")
    return {**row, "status": "pass" if ok else "fail", "rel_err": err, "rel_err_single": err_single,
            "counterpart": counterpart.name, "backend": impl.last_backend, "message": why}


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
            row.update(status="time-limit", message=f"one call took {slowest_ms / 1e3:.1f} s > {spec.max_trial_seconds:g} s")
        else:
            phase("timing")
            row.update(_timed_calls(impl, step, timer, plan_calls(slowest_ms, spec.policy())), status="ok")
        row["backend"] = impl.last_backend
    row.update(probe.peaks())
    gpu = sampler.per_gpu()
    if dev.type == "cuda":
        entry = {**(gpu[0] if gpu else {}), "rank": rank, "cuda_device": dev.index,
                 "max_memory_allocated": row.get("max_memory_allocated"),
                 "max_memory_reserved": row.get("max_memory_reserved")}
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
        return {"max_memory_allocated": torch.cuda.max_memory_allocated(self.dev),
                "max_memory_reserved": torch.cuda.max_memory_reserved(self.dev),
                "device_total_bytes": torch.cuda.get_device_properties(self.dev).total_memory}
