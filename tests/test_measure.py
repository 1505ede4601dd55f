"""OOM classification, timing plans, the NVML sampler (fake backend), units."""

import json
import os
import platform
import threading
import time

import pytest
import torch

from attnbench.errors import AttnbenchError
from attnbench.measure.memory import NvmlSampler
from attnbench.measure.oom import classify
from attnbench.measure.timing import (
    TimingPolicy,
    host_bound,
    plan_calls,
    summarize,
    warm_up,
)
from attnbench.units import (
    format_bytes,
    format_gib,
    format_tokens,
    parse_bytes,
    parse_int_list,
    parse_tokens,
    short_tokens,
)


@pytest.mark.parametrize(
    "exc,expected",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        (MemoryError(), "oom"),
        (
            RuntimeError(
                "[enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to allocate 8589934592 bytes."
            ),
            "oom",
        ),
        (RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"), "oom"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_ALLOC_FAILED"), "oom"),
        (RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"), "oom"),
        (RuntimeError("The size of tensor a (4) must match the size of tensor b (5)"), "error"),
        (RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"), "error"),
        (ValueError("out of memory"), "error"),  # only allocator errors count
        (KeyError("x"), "error"),
    ],
)
def test_oom_classification(exc, expected):
    assert classify(exc) == expected


def test_a_real_cpu_allocation_failure_is_an_oom():
    with pytest.raises(RuntimeError) as info:
        torch.empty(1 << 62, dtype=torch.uint8)
    assert classify(info.value) == "oom"


FRESH_PROCESS_UNDER_A_LIMIT = """
import torch
from attnbench.measure.memory import CpuMemoryLimit
from attnbench.trials.reference import masked_reference
n = 512
with CpuMemoryLimit(32 << 20):  # this process's first parallel float64 work, under the limit
    q, k, v = (torch.randn(1, n, 2, 64) for _ in range(3))
    out = masked_reference(q, k, v, torch.ones(n, n, dtype=torch.bool).tril())  # about 12 MiB
    big = None
    try:
        big = torch.empty(64 << 20, dtype=torch.uint8)  # past the limit
    except RuntimeError:
        pass
print(bool(torch.isfinite(out).all()), big is None)
"""


def test_a_cpu_limit_is_the_trials_alone_on_any_machine():
    """In a fresh process the first parallel work starts torch's thread pool and BLAS (80 MiB of
    address space at once on an Intel Xeon with MKL, less on an AMD EPYC): a trial's 32 MiB
    must not pay for it, so a float64 reference check of about 12 MiB passes on every machine,
    while 64 MiB is still refused."""
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", FRESH_PROCESS_UNDER_A_LIMIT], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]


FREED_UNDER_A_LIMIT = """
import torch
from attnbench.measure.memory import CpuMemoryLimit, current_vm_bytes
with CpuMemoryLimit(256 << 20):
    before = current_vm_bytes()
    for _ in range(3):  # glibc keeps the second block of a size once the first was freed
        block = torch.ones(24 << 20, dtype=torch.uint8)
        del block
    print((current_vm_bytes() - before) >> 20)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc thresholds")
def test_a_freed_block_leaves_the_address_space_a_cpu_limit_caps():
    """Under a CPU memory limit a block freed is unmapped, the second of its size too, so the
    limit meets what the trial's tensors hold: glibc otherwise keeps such a block in its heap
    after the first free (24 MiB here), and the edge moved from process to process."""
    import subprocess
    import sys

    from conftest import ROOT

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", FREED_UNDER_A_LIMIT], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) < 4  # MiB kept after three 24 MiB blocks came and went


@pytest.mark.parametrize(
    "first_ms,budget_s", [(0.01, 60), (5.0, 60), (400.0, 1.0), (900.0, 1.0), (4900.0, 5.0), (30_000.0, 60.0)]
)
def test_timing_plan_stays_within_budget(first_ms, budget_s):
    policy = TimingPolicy(warmup=1, min_samples=5, max_samples=50, target_ms=1000, budget_s=budget_s)
    warmup, n = plan_calls(first_ms, policy)
    assert n >= 1 and n <= 50
    assert (warmup + n) * first_ms <= max(budget_s * 1e3, first_ms)
    if first_ms * 6 <= budget_s * 1e3:
        assert n >= 5


def test_summary_statistics():
    s = summarize([5.0, 1.0, 3.0, 2.0, 4.0])
    assert s["time_ms"] == 3.0 and s["time_min_ms"] == 1.0 and s["time_max_ms"] == 5.0
    assert s["time_iqr_ms"] > 0
    assert summarize([])["time_ms"] is None


class FakeNvml:
    """Two GPUs whose used memory follows a script; ``set`` returns once the sampler's thread
    has read both GPUs in the new state (no sleeping: a busy machine only makes it slower)."""

    def __init__(self):
        self.used = [1000, 500]
        self.lock = threading.Lock()
        self.read = [threading.Event(), threading.Event()]

    def device_count(self):
        return 2

    def used_bytes(self, index):
        with self.lock:
            self.read[index].set()
            return self.used[index]

    def set(self, used):
        with self.lock:
            self.used = used
            for event in self.read:
                event.clear()
        for event in self.read:
            assert event.wait(timeout=60), "the sampler thread never polled"


def test_nvml_sampler_tracks_per_gpu_peaks():
    nvml = FakeNvml()
    with NvmlSampler(nvml, interval_s=0.001) as sampler:
        nvml.set([9000, 700])
        nvml.set([2000, 600])
    rows = sampler.per_gpu()
    assert rows == [
        {"index": 0, "nvml_index": 0, "nvml_used_before": 1000, "nvml_used_peak": 9000},
        {"index": 1, "nvml_index": 1, "nvml_used_before": 500, "nvml_used_peak": 700},
    ]


def test_nvml_sampler_without_nvml_is_empty():
    with NvmlSampler(None) as sampler:
        pass
    assert sampler.per_gpu() == []


def test_units():
    assert parse_bytes("2GiB") == 2 << 30 and parse_bytes("512MB") == 512 * 10**6 and parse_bytes("1.5GiB") == 3 << 29
    assert parse_tokens("64K") == 65536 and parse_tokens("1M") == 1 << 20 and parse_tokens(4096) == 4096
    assert parse_int_list("2048,4096", "x") == [2048, 4096]
    assert format_tokens(65536) == "65,536 (64K)" and format_tokens(100) == "100"
    for bad in ("2 parsecs", "", "GiB", "80"):
        with pytest.raises(AttnbenchError):
            parse_bytes(bad)


@pytest.mark.parametrize(
    "n,text",
    [
        (0, "0 B"),
        (42.4, "42.4 B"),  # a quadratic fit's coefficient
        (1024, "1.00 KiB"),
        (-58_470, "-57.1 KiB"),
        (16_351_232, "15.6 MiB"),  # 16,351,232 / 2**20 = 15.59
        (1023 * 2**20, "1,023 MiB"),
        (1_149_000_000, "1.07 GiB"),  # 1.149e9 / 2**30 = 1.0701
    ],
)
def test_memory_reads_in_the_binary_unit_its_size_calls_for_to_three_digits(n, text):
    assert format_bytes(n) == text


def test_a_limit_reads_as_a_profile_writes_it_whatever_its_size():
    assert [format_gib(n) for n in (4 << 30, 100 << 20, 1024, 512)] == ["4 GiB", "100 MiB", "1 KiB", "512 B"]


def test_a_length_past_a_binary_giga_reads_in_g_not_thousands_of_m():
    assert format_tokens(1_080_308_587) == "1,080,308,587 (1.0G)"  # 1,080,308,587 / 2**30 = 1.006
    assert short_tokens(3 * 2**29) == "1.5G" and short_tokens(1023 * 2**20) == "1023M"
    for n in (2**30, 5 * 2**31):  # the exact form reads back as the length
        assert parse_tokens(short_tokens(n, exact=True)) == n


class FakeClockedNvml(FakeNvml):
    """FakeNvml with clocks, power and throttle reasons that follow a script."""

    def __init__(self):
        super().__init__()
        self.sm = [1980, 1410]
        self.throttle = 0

    def clocks(self, index):
        with self.lock:
            return {"sm_mhz": self.sm[index], "mem_mhz": 2619, "power_w": 300.0 + index, "throttle": self.throttle}


def test_nvml_sampler_records_clocks_power_and_throttle_reasons_while_recording():
    nvml = FakeClockedNvml()
    sampler = NvmlSampler(nvml)
    sampler._poll()  # outside recording(): no readings kept
    with sampler.recording():
        sampler._poll()
        nvml.sm = [1650, 1410]
        nvml.throttle = 0x4 | 0x20  # power cap, thermal
        sampler._poll()
        sampler._poll()
    summary = sampler.clock_summary()
    gpu0, gpu1 = summary["clocks"]
    assert gpu0["readings"] == 3 and gpu0["sm_mhz"] == {"min": 1650, "median": 1650, "max": 1980}
    assert gpu0["throttle_reasons"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert gpu1["sm_mhz"] == {"min": 1410, "median": 1410, "max": 1410} and gpu1["power_w"]["median"] == 301.0
    assert summary["clocks_moved"]  # 330 MHz of 1650 is 20%, beyond 3%


def test_steady_clocks_are_not_flagged_and_memory_only_backends_have_no_clocks():
    nvml = FakeClockedNvml()
    sampler = NvmlSampler(nvml)
    with sampler.recording():
        for mhz in (1980, 1975, 1980):
            nvml.sm = [mhz, 1410]
            sampler._poll()
    assert sampler.clock_summary()["clocks_moved"] is False
    plain = NvmlSampler(FakeNvml())
    with plain.recording():
        plain._poll()
    assert plain.clock_summary() == {} and plain.clocks_settled()


def test_warm_up_runs_until_the_clocks_settle_and_plans_from_warm_calls():
    calls = iter([50.0, 30.0, 12.0, 10.0, 11.0, 10.5, 10.2])  # ms: cold, then settling
    made = []

    def timer(fn):
        made.append(1)
        return next(calls)

    policy = TimingPolicy(warmup=3, warmup_s=0.0, budget_s=1e6)
    w = warm_up(lambda: None, timer, policy, cuda=True, settled=lambda: len(made) >= 6)
    assert w.calls == 6 and w.last_ms == 10.5  # median of 10.0, 11.0, 10.5
    warmup, n = plan_calls(
        w.last_ms, TimingPolicy(warmup=0, min_samples=10, max_samples=50, target_ms=1000, budget_s=1e6)
    )
    assert (warmup, n) == (0, 50)  # 1000 ms / 10.5 ms = 95 calls, capped at 50; the cold 50 ms would give 20
    assert TimingPolicy().warmup_seconds(cuda=True) == 1.0 and TimingPolicy().warmup_seconds(cuda=False) == 0.0


def test_a_warm_up_call_that_would_end_past_the_cap_is_not_started():
    # calls of at least 0.2 s (a slower machine only lengthens them), a 0.3 s cap, clocks that
    # never settle: one call warms up, where a second would end past the cap
    def timer(fn):
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    policy = TimingPolicy(warmup=1, warmup_s=0.1, budget_s=1e6)
    w = warm_up(lambda: time.sleep(0.2), timer, policy, cuda=True, settled=lambda: False, cap_s=0.3)
    assert w.calls == 1
    # a warm call already made (the one that decided the time limit) is that warm-up
    w = warm_up(lambda: time.sleep(0.2), timer, policy, cuda=True, settled=lambda: False, cap_s=0.3, warm_ms=(200.0,))
    assert w.calls == 0 and w.last_ms == 200.0


def test_host_bound_threshold():
    assert host_bound(3.0, 1.0) is True  # two thirds of an eager call is the host's
    assert host_bound(1.2, 1.0) is False
    assert host_bound(1.0, None) is None


@pytest.mark.slow
def test_repeat_times_each_point_in_fresh_processes_and_rows_record_the_process(tmp_path, in_process):
    out = tmp_path / "r"
    done = in_process(  # the command in this process: the fresh processes are its trials'
        "bench",
        "--impl",
        "naive",
        "--seq-lens",
        "128",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--repeat",
        "2",
        "--timing-budget",
        "2",
        "--out",
        out,
    )
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    timed = [r for r in rows if r.get("kind") == "points"]
    assert [r["process"] for r in timed] == [0, 1]
    for r in timed:
        assert r["status"] == "ok" and len(r["times_ms"]) >= 10 and r["time_n"] == len(r["times_ms"])
        assert r["time_ci_low"] <= r["time_ms"] <= r["time_ci_high"]
        # executed FLOPs over the time bounds, by hand: the slower bound gives the lower rate
        assert r["tflops_executed_ci_low"] == pytest.approx(r["flops_executed"] / (r["time_ci_high"] / 1e3) / 1e12)
        assert r["tflops_executed_ci_high"] == pytest.approx(r["flops_executed"] / (r["time_ci_low"] / 1e3) / 1e12)
        assert r["warmup_calls"] >= 1 and r.get("gpu_time_ms") is None  # no GPU time on the CPU


def test_a_gpu_without_clock_counters_keeps_its_memory_sampling():
    class NoClocks(FakeNvml):
        def clocks(self, index):
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")

    nvml = NoClocks()
    sampler = NvmlSampler(nvml)
    with sampler.recording():
        sampler._poll()
        nvml.used = [5000, 500]
        sampler._poll()
    assert sampler.clock_summary() == {} and sampler.peak == [5000, 500]


class ScriptedTimer:
    """A timer whose calls take the given milliseconds, no clock involved; ``cuda`` names the
    device whose rule applies."""

    name = "scripted"

    def __init__(self, cuda: bool, times_ms: list[float]) -> None:
        self.cuda, self.times_ms, self.calls = cuda, list(times_ms), 0

    def __call__(self, fn) -> float:
        self.calls += 1
        return self.times_ms.pop(0) if self.times_ms else 100.0


@pytest.mark.parametrize(
    "cuda,times_ms,status,calls_to_verdict",
    [
        (True, [1200, 100], "ok", None),  # a cold CUDA call over the limit (library setup): a warm call decides
        (True, [1200, 1100], "time-limit", 2),
        (False, [1200], "time-limit", 1),  # on the CPU a cold call is a warm one: judged at once
        (False, [900], "ok", None),
    ],
)
def test_the_time_limit_is_judged_on_a_warm_call_on_cuda_and_on_the_first_on_the_cpu(
    cuda, times_ms, status, calls_to_verdict
):
    from attnbench.measure.core import measure_step

    timer, phases = ScriptedTimer(cuda, times_ms), []
    policy = TimingPolicy(warmup=0, warmup_s=0, min_samples=2, max_samples=2, target_ms=0, budget_s=30)
    m = measure_step(lambda: None, policy, timer, 1.0, phase=lambda name, limit_s=None: phases.append((name, limit_s)))
    assert m.status == status, m.message
    if calls_to_verdict:
        assert timer.calls == calls_to_verdict and m.times_ms == []
    # the parent kills a call at the limit its phase announced: 3x on CUDA for the cold call
    assert phases[0] == ("first-call", 3.0 if cuda else 1.0)
    assert ("warm-call", 1.0) in phases if cuda and times_ms[0] > 1000 else "warm-call" not in dict(phases)


@pytest.mark.parametrize("phase", ["first-call", "warm-call"])
def test_a_call_past_its_limit_is_killed_at_the_limit_with_no_grace(phase):
    """The limit a call's phase announces is the moment it is killed: a user's 60 s is 60 s."""
    import sys

    from attnbench.runtime.supervise import _phase_deadline, supervise

    assert _phase_deadline(phase, 60.0) == 60.0
    child = f"print('phase {phase} 0.5', flush=True); import time; time.sleep(600)"
    out = supervise([sys.executable, "-c", child], 600)
    assert out.status == "time-limit" and "past the 0.5 s limit: killed at" in out.message, out


def test_cpu_memory_in_use_is_never_negative_when_the_resident_set_shrinks(monkeypatch):
    """The resident set may hand pages back after the baseline: the inputs then hold no memory
    that can be counted, never a negative amount (a reader refuses negative sizes)."""
    import attnbench.measure.core as core

    rss = iter([10_000_000, 9_995_904, 10_004_096])  # baseline, shrunk by 4 KiB, grown by 4 KiB
    monkeypatch.setattr(core, "current_rss_bytes", lambda: next(rss))
    probe = core.MemoryProbe()
    probe.start(None)
    assert probe.in_use() == 0
    assert probe.in_use() == 4096


@pytest.mark.parametrize("first_ms,warmup_calls", [(2500.0, 0), (20.0, 1)])
def test_on_the_cpu_a_first_call_of_seconds_is_the_warm_up(first_ms, warmup_calls):
    """Near the time limit a CPU trial is its first call and its timed calls; a short first
    call is still followed by the policy's warm-up call."""
    from attnbench.measure.core import measure_step

    timer = ScriptedTimer(False, [first_ms])
    policy = TimingPolicy(warmup=1, min_samples=1, max_samples=1, target_ms=0, budget_s=30)
    m = measure_step(lambda: None, policy, timer, 60.0)
    assert m.status == "ok" and m.warmup_calls == warmup_calls and len(m.times_ms) == 1
    assert timer.calls == 1 + warmup_calls + 1
