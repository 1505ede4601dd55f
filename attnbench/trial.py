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
# The cold first call may take this many times the limit before it is killed: the time
# limit is decided on a warm call.
COLD_CALL_FACTOR = 3.0


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
            call_ms = first_ms
            if first_ms > spec.max_trial_seconds * 1e3:
                # the cold call pays for allocator growth, autotuning and caches: decide on a warm one
                phase("warm-call")
                call_ms = row["warm_call_ms"] = timer(step)
            if call_ms > spec.max_trial_seconds * 1e3:
                row.update(status="time-limit", message=f"a warm call took {call_ms / 1e3:.1f} s > {spec.max_trial_seconds:g} s")
            else:
                phase("timing")
                row["times_ms"] = collect(step, timer, call_ms, spec.policy())
                row.update(status="ok")
        row["backend"] = impl.last_backend
        row.update(summarize(row["times_ms"]))
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


def run_verify_isolated(cases: list, memory_limit: int | None = None,
                        max_seconds: float = STARTUP_ALLOWANCE_S) -> list[dict[str, Any]]:
    """Reference checks in a child process, like a trial: inputs and the float64 reference
    never live in the calling process, and the trial's memory and time limits apply."""
    from attnbench.errors import AttnbenchError

    if not cases:
        return []
    job = {"job": "verify", "cases": [asdict(c) for c in cases], "memory_limit": memory_limit}
    result = _run_child(job, max_seconds)
    if "rows" not in result:
        raise AttnbenchError(f"the reference check could not run ({result.get('status')}: {result.get('message')}); "
                             "use a smaller configuration or raise --memory-limit")
    return result["rows"]


TEMP_PREFIX = "attnbench-trial-"


def _run_child(job: dict[str, Any], phase_limit_s: float) -> dict[str, Any]:
    remove_orphaned_temp_dirs()
    with tempfile.TemporaryDirectory(prefix=f"{TEMP_PREFIX}{os.getpid()}-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(job))
        outcome = _supervise([sys.executable, "-m", "attnbench.trial", str(job_path), str(result_path)], phase_limit_s,
                             memory_limit=job.get("spec", job).get("memory_limit"))
        if result_path.exists():
            return json.loads(result_path.read_text())
        return outcome


def remove_orphaned_temp_dirs(root: Path | None = None) -> list[Path]:
    """Temp dirs of attnbench parents that died without cleaning up (SIGKILL): their trials
    died with them (parent-death signal), so nothing else uses the dirs."""
    import shutil

    removed = []
    for d in Path(root or tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*-*"):
        pid = d.name[len(TEMP_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)) or d.is_symlink() or d.stat().st_uid != os.getuid():
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _die_with_parent() -> None:
    """In the child before exec: Linux sends SIGKILL when the parent dies, however it dies."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _supervise(cmd: list[str], phase_limit_s: float, extra_env: dict[str, str] | None = None,
               memory_limit: int | None = None) -> dict[str, Any]:
    """Run ``cmd``; kill it (and its process group) when a phase runs past its limit. The
    child dies with this process (parent-death signal), and its exit is classified by
    evidence: the cgroup's OOM-kill counter and its resident memory against the limit."""
    oom_kills_before = cgroup_oom_kills()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=child_env(extra_env), start_new_session=True,
                            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
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
    rss_peak = 0
    try:
        while proc.poll() is None:
            limit = STARTUP_ALLOWANCE_S if state["phase"] in UNTIMED_PHASES else phase_limit_s + phase_grace_s(phase_limit_s)
            if state["phase"] == "first-call":
                limit = COLD_CALL_FACTOR * phase_limit_s + phase_grace_s(phase_limit_s)
            rss_peak = max(rss_peak, _rss_of(proc.pid))
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
    evidence = {"oom_kills": (oom_kills_before, cgroup_oom_kills()), "rss_peak": rss_peak, "memory_limit": memory_limit}
    return _classify_exit(proc.returncode, list(stderr_tail), evidence)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _classify_exit(returncode: int, stderr_tail: list[str], evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    """A child that died without writing its result. A signal we did not send is the
    kernel's OOM killer only with evidence: the cgroup's oom_kill counter rose, or the
    child's resident memory reached its limit; any other signal is "killed"."""
    evidence = evidence or {}
    last = next((line for line in reversed(stderr_tail) if line.strip()), "")
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else str(-returncode)
        before, after = evidence.get("oom_kills") or (None, None)
        limit, rss = evidence.get("memory_limit"), evidence.get("rss_peak") or 0
        if returncode == -signal.SIGKILL and before is not None and after is not None and after > before:
            why = f"the cgroup's oom_kill count rose from {before} to {after}"
        elif returncode == -signal.SIGKILL and limit and rss >= 0.9 * limit:
            why = f"its resident memory reached {rss / 2**20:,.0f} MiB of the {limit / 2**20:,.0f} MiB limit"
        else:
            return {"status": "killed", "message": f"trial process killed by {name}, not by attnbench (no sign of the OOM killer)",
                    "times_ms": []}
        return {"status": "host-oom", "message": f"trial process killed by {name}: the kernel's OOM killer ({why})",
                "times_ms": []}
    from attnbench.measure.oom import classify_text

    return {"status": classify_text(last), "message": f"trial process exited with {returncode}: {last}"[:400], "times_ms": []}


def cgroup_oom_kills() -> int | None:
    """The OOM-kill counter of this process's memory cgroup (v2, or v1's oom_control), or None."""
    try:
        rel = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::") or ":memory:" in line)
    except (OSError, StopIteration):
        rel = "/"
    for path in (Path("/sys/fs/cgroup") / rel.lstrip("/") / "memory.events", Path("/sys/fs/cgroup/memory.events"),
                 Path("/sys/fs/cgroup/memory") / rel.lstrip("/") / "memory.oom_control",
                 Path("/sys/fs/cgroup/memory/memory.oom_control")):
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def _rss_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _worker(job_path: str, result_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    if job["job"] == "verify":
        from attnbench.measure.memory import CpuMemoryLimit
        from attnbench.reference import VerifyCase, run_case

        cases = [VerifyCase(**c) for c in job["cases"]]
        on_cpu = all(c.device == "cpu" for c in cases)
        with CpuMemoryLimit(job.get("memory_limit") if on_cpu else None):
            result: dict[str, Any] = {"rows": [run_case(c) for c in cases]}
    else:
        def phase(name: str) -> None:
            print(f"phase {name}", flush=True)

        result = execute(TrialSpec(**job["spec"]), phase)
    from attnbench.results import write_text_atomic

    write_text_atomic(Path(result_path), json.dumps(result, default=str))


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
