"""One trial: build the implementation, allocate inputs, run it once for memory, then time it.

``execute`` runs a trial in this process. ``run_isolated`` runs it in a fresh Python process
(the default), so an OOM, a crash or allocator fragmentation cannot change later trials, and
a trial over its time limit can be killed. The child speaks a tiny protocol: ``phase NAME``
lines on stdout (so the parent knows when the timed work starts) and the result as a JSON
file.

    python -m attnbench.trial JOB.json RESULT.json
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from attnbench.measure.timing import TimingPolicy

# Seconds a child may take to start (import torch, create a CUDA context, allocate inputs)
# before the timed work begins, and the grace on top of each phase's time limit.
STARTUP_ALLOWANCE_S = 300.0


# Phases whose length is not the trial's business: starting up, compiling kernels.
UNTIMED_PHASES = ("startup", "compile")


def phase_grace_s(limit_s: float) -> float:
    """Slack on top of a phase's limit before the parent kills the child."""
    return 2.0 + 0.1 * limit_s


@dataclass
class TrialSpec:
    workload: dict[str, Any]           # Workload fields
    max_trial_seconds: float = 60.0    # one call longer than this is a time-limit
    memory_limit: int | None = None    # bytes the trial may allocate
    timing: dict[str, Any] = field(default_factory=dict)  # TimingPolicy fields
    seed: int = 0

    def policy(self) -> TimingPolicy:
        return TimingPolicy(**{**self.timing, "budget_s": self.max_trial_seconds})


# ---------------------------------------------------------------------------------------
# In-process execution
# ---------------------------------------------------------------------------------------

def execute(spec: TrialSpec, phase: Callable[[str], None] = lambda name: None) -> dict[str, Any]:
    """Run one trial here; never raises for a failing trial, returns its row fields."""
    import torch

    from attnbench import impls
    from attnbench.measure import oom
    from attnbench.measure.memory import CpuMemoryLimit, NvmlSampler, open_nvml
    from attnbench.measure.timing import Timer, collect, summarize
    from attnbench.workload import Workload

    wl = Workload(**spec.workload)
    cuda = wl.device == "cuda"
    row: dict[str, Any] = {"status": "error", "message": "", "times_ms": []}
    nvml, nvml_note = open_nvml() if cuda else (None, "")
    if nvml_note:
        row["nvml_note"] = nvml_note
    sampler = NvmlSampler(nvml)
    mem = _MemoryProbe(cuda)
    try:
        impl = impls.build(wl.impl, **wl.config)
        row.update(impls.recorded_metadata(wl.impl))
        impl.check_shape(wl.seq_len, wl.heads)
        timer = Timer(wl.device)
        row["timer"] = timer.name
        limit = spec.memory_limit
        mem.start(limit)
        with sampler, CpuMemoryLimit(limit if not cuda else None):
            q, k, v = wl.make_inputs(torch.Generator(device=wl.device).manual_seed(spec.seed))
            row["inputs_bytes"] = mem.in_use()
            step = _step(impl, wl, q, k, v)
            if impl.compiles:
                # a compiled kernel's first call pays for compilation: record it apart
                phase("compile")
                row["compile_ms"] = timer(step)
            phase("first-call")
            first_ms = timer(step)
            row["first_call_ms"] = first_ms
            if first_ms > spec.max_trial_seconds * 1e3:
                row.update(status="time-limit", message=f"one call took {first_ms / 1e3:.1f} s > {spec.max_trial_seconds:g} s")
            else:
                phase("timing")
                row["times_ms"] = collect(step, timer, first_ms, spec.policy())
                row.update(status="ok")
        row["backend"] = impl.last_backend
        row.update(summarize(row["times_ms"]))
        mem.freeze()  # counting pairs from a declared mask allocates on the device: not the trial's peak
        del step, q, k, v  # and gets the inputs' memory for it
        row.update(_accounting(impl, wl, row.get("time_ms")))
    except Exception as exc:  # a failing trial is data, not a crash
        row.update(status=oom.classify(exc), message=oom.one_line(exc))
    row.update(mem.peaks())
    row["gpus"] = _per_gpu(sampler, mem)
    row["floor_bytes"] = wl.floor_bytes
    peak = row.get("max_memory_allocated") if cuda else row.get("cpu_peak_rss_delta")
    row["peak_bytes"] = peak
    row["peak_counter"] = "cuda.max_memory_allocated" if cuda else "cpu.peak_rss_delta"
    row["peak_over_floor"] = peak / wl.floor_bytes if peak else None
    return row


def _step(impl, wl, q, k, v) -> Callable[[], None]:
    import torch

    if wl.mode == "fwd":
        def forward():
            with torch.no_grad():
                impl(q, k, v, is_causal=wl.causal)
        return forward

    grad_out = torch.randn_like(q)

    def forward_backward():
        for t in (q, k, v):
            t.grad = None
        impl(q, k, v, is_causal=wl.causal).backward(grad_out)
    return forward_backward


def _accounting(impl, wl, time_ms: float | None) -> dict[str, Any]:
    useful = wl.flops(impl.useful_pairs(wl.seq_len, wl.heads, wl.causal))
    executed = wl.flops(impl.executed_pairs(wl.seq_len, wl.heads, wl.causal))
    out = {"flops_useful": useful, "flops_executed": executed,
           "kept_fraction": impl.useful_pairs(wl.seq_len, wl.heads, wl.causal) / (wl.heads * wl.seq_len**2)}
    if getattr(impl, "pairs_counted", None):  # counted from a declared mask: exact or by blocks
        out["pairs_counted"] = impl.pairs_counted
    if time_ms:
        out.update(
            tokens_per_s=wl.batch * wl.seq_len / (time_ms / 1e3),
            tflops_useful=useful / (time_ms / 1e3) / 1e12,
            tflops_executed=executed / (time_ms / 1e3) / 1e12,
        )
    return out


class _MemoryProbe:
    """Allocator peaks on CUDA (reset per trial), resident-set peaks on the CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.base = 0
        self.frozen: dict[str, Any] | None = None

    def freeze(self) -> None:
        """Peaks from now on are the ones measured so far."""
        self.frozen = self.peaks()

    def start(self, limit: int | None) -> None:
        import torch

        if self.cuda:
            torch.cuda.set_device(0)
            torch.cuda.empty_cache()
            total = torch.cuda.get_device_properties(0).total_memory
            if limit:
                torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), 0)
            torch.cuda.reset_peak_memory_stats(0)
            self.base = torch.cuda.memory_allocated(0)
        else:
            from attnbench.measure.memory import current_rss_bytes

            torch.ones(256, 256) @ torch.ones(256, 256)  # start the thread pool before any limit
            _reset_rss_peak()
            self.base = current_rss_bytes()

    def in_use(self) -> int:
        import torch

        if self.cuda:
            return torch.cuda.memory_allocated(0) - self.base
        from attnbench.measure.memory import current_rss_bytes

        return current_rss_bytes() - self.base

    def peaks(self) -> dict[str, Any]:
        import torch

        if self.frozen is not None:
            return self.frozen
        if self.cuda:
            if not torch.cuda.is_initialized():
                return {}
            return {
                "max_memory_allocated": torch.cuda.max_memory_allocated(0),
                "max_memory_reserved": torch.cuda.max_memory_reserved(0),
                "device_total_bytes": torch.cuda.get_device_properties(0).total_memory,
            }
        from attnbench.measure.memory import rss_peak_bytes

        return {"cpu_peak_rss_delta": max(0, _rss_hwm() - self.base) if self.base else None,
                "cpu_peak_rss": rss_peak_bytes()}


def _reset_rss_peak() -> None:
    """Linux resets VmHWM on '5' to clear_refs, so in-process trials get their own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def _rss_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    from attnbench.measure.memory import rss_peak_bytes

    return rss_peak_bytes()


def _per_gpu(sampler, mem: _MemoryProbe) -> list[dict[str, Any]]:
    gpus = sampler.per_gpu()
    peaks = mem.peaks() if mem.cuda else {}
    for g in gpus:
        if g["index"] == 0 and peaks:
            g["max_memory_allocated"] = peaks["max_memory_allocated"]
            g["max_memory_reserved"] = peaks["max_memory_reserved"]
    return gpus


# ---------------------------------------------------------------------------------------
# Isolated execution: one fresh process per trial
# ---------------------------------------------------------------------------------------

def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONUNBUFFERED"] = "1"
    # glibc reserves 64 MiB of address space per malloc arena; a few arenas keep the CPU
    # memory limit (an address-space limit) about real allocations.
    env.setdefault("MALLOC_ARENA_MAX", "2")
    # attnbench must be importable by the child however the parent found it
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_isolated(spec: TrialSpec) -> dict[str, Any]:
    """Run the trial in a child process; returns its row fields, classifying a kill or crash."""
    return _run_child({"job": "trial", "spec": asdict(spec)}, spec.max_trial_seconds)


def run_verify_isolated(cases: list) -> list[dict[str, Any]]:
    """Reference checks in a child process (keeps CUDA out of the calling process)."""
    result = _run_child({"job": "verify", "cases": [asdict(c) for c in cases]}, STARTUP_ALLOWANCE_S)
    if "rows" not in result:
        raise RuntimeError(f"reference check process failed: {result.get('message')}")
    return result["rows"]


def _run_child(job: dict[str, Any], phase_limit_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="attnbench-trial-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        outcome = _supervise([sys.executable, "-m", "attnbench.trial", str(job_path), str(result_path)], phase_limit_s)
        if result_path.exists():
            return json.loads(result_path.read_text())
        return outcome


def _supervise(cmd: list[str], phase_limit_s: float, extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; kill it (and its process group) when a phase runs past its limit."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(extra_env), start_new_session=True)
    state = {"phase": "startup", "since": time.monotonic()}
    stderr_tail: deque[str] = deque(maxlen=40)

    def read_phases():
        for line in proc.stdout:
            if line.startswith("phase "):
                state.update(phase=line.split()[1], since=time.monotonic())

    def read_stderr():
        for line in proc.stderr:
            stderr_tail.append(line.rstrip())

    readers = [threading.Thread(target=f, daemon=True) for f in (read_phases, read_stderr)]
    for r in readers:
        r.start()
    killed = None
    try:
        while proc.poll() is None:
            limit = STARTUP_ALLOWANCE_S if state["phase"] in UNTIMED_PHASES else phase_limit_s + phase_grace_s(phase_limit_s)
            elapsed = time.monotonic() - state["since"]
            if elapsed > limit:
                killed = f"killed in phase {state['phase']} after {elapsed:.0f} s (limit {limit:.0f} s)"
                _kill(proc)
                break
            time.sleep(0.05)
    except BaseException:  # Ctrl-C: the child must not outlive us
        _kill(proc)
        raise
    proc.wait()
    for r in readers:
        r.join(timeout=5)
    if killed:
        return {"status": "time-limit", "message": killed, "times_ms": []}
    return _classify_exit(proc.returncode, list(stderr_tail))


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _classify_exit(returncode: int, stderr_tail: list[str]) -> dict[str, Any]:
    """A child that died without writing its result."""
    last = next((line for line in reversed(stderr_tail) if line.strip()), "")
    if returncode == -signal.SIGKILL:
        # we did not kill it, so the kernel did: its OOM killer
        return {"status": "oom", "message": "killed by SIGKILL, not by attnbench: the kernel's OOM killer", "times_ms": []}
    from attnbench.measure.oom import is_oom_text

    status = "oom" if is_oom_text(last) else "error"
    return {"status": status, "message": f"trial process exited with {returncode}: {last}"[:400], "times_ms": []}


def _worker(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    if job["job"] == "verify":
        from attnbench.reference import VerifyCase, run_case

        result: dict[str, Any] = {"rows": [run_case(VerifyCase(**c)) for c in job["cases"]]}
    else:
        def phase(name: str) -> None:
            print(f"phase {name}", flush=True)

        result = execute(TrialSpec(**job["spec"]), phase)
    tmp = Path(result_path).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, default=str))
    os.replace(tmp, result_path)


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
