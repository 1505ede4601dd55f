"""The gate's rules on rows written out by hand: what it compares a CPU's memory by, and that a
search which did not finish is said to be not gated. (Real runs: test_check.py and
test_check_reruns.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from attnbench.check import Thresholds, run_check

MACHINE = {"machine": "cpu: Test CPU", "cpu": "Test CPU"}
COMMON = {"schema": 1, "run": "r", "series": "s", "label": "naive", "impl": "naive", "config": {}, "batch": 1}
COMMON |= {"heads": 2, "head_dim": 16, "dtype": "fp32", "device": "cpu", "causal": False, "mode": "fwd"}
COMMON |= {"env": MACHINE, "memory_limit": 256 << 20}
MiB = 1 << 20


def trial(seq_len: int, rss: int, tensors: int | None = None, status: str = "ok", **fields) -> dict:
    row = {**COMMON, "kind": "max-seq", "seq_len": seq_len, "status": status, "message": "", "times_ms": [1.0]}
    row |= {"peak_bytes": rss, "peak_counter": "cpu.peak_rss_delta", "cpu_peak_rss_delta": rss}
    return row | ({"cpu_tensor_peak_bytes": tensors} if tensors else {}) | fields


def result(seq_len: int, first_failure: int) -> dict:
    row = {**COMMON, "kind": "max-seq-result", "seq_len": seq_len, "first_failure": first_failure}
    return row | {"stop_status": "oom", "stopped_by": "memory", "granularity": 128, "resolution": 128}


def write(path: Path, rows: list[dict]) -> Path:
    path.mkdir(parents=True)
    (path / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def memory(tmp_path, base: list[dict], cur: list[dict]):
    report = run_check(write(tmp_path / "b", base), write(tmp_path / "c", cur), Thresholds(aspects=("memory",)))
    return report, [f for f in report.findings if f.aspect == "memory"]


def test_resident_set_growth_that_moved_between_two_single_processes_is_not_a_regression(tmp_path):
    """The issue's two identical runs: 22.00 MB then 58.81 MB of resident-set growth at 1K,
    one process each. One process per side cannot show how far the resident set moves."""
    report, found = memory(tmp_path, [trial(1024, 22_000_000)], [trial(1024, 58_810_000)])
    assert report.exit_code == 0 and [f.verdict for f in found] == ["not gated"]
    assert "one process on a side" in found[0].evidence


def test_the_cpu_tensor_count_is_compared_where_both_sides_have_it(tmp_path):
    """The tensor bytes a call held are exact: the same count passes whatever the resident set
    did; 5% more is a regression."""
    base = [trial(1024, 22_000_000, tensors=17 * MiB)]
    report, found = memory(tmp_path, base, [trial(1024, 58_810_000, tensors=17 * MiB)])
    assert report.exit_code == 0 and [f.verdict for f in found] == ["unchanged"]
    report, found = memory(tmp_path / "more", base, [trial(1024, 22_000_000, tensors=round(17 * MiB * 1.05))])
    assert report.exit_code == 1 and [f.verdict for f in found] == ["regression"]
    assert abs(found[0].numbers["ratio"] - 1.05) < 1e-3


def test_resident_set_growth_beyond_the_spread_of_three_processes_each_is_judged(tmp_path):
    base = [trial(1024, rss, process=i) for i, rss in enumerate((60 * MiB, 62 * MiB, 61 * MiB))]
    cur = [trial(1024, rss, process=i) for i, rss in enumerate((120 * MiB, 121 * MiB, 119 * MiB))]
    report, found = memory(tmp_path, base, cur)
    assert report.exit_code == 1 and [f.verdict for f in found] == ["regression"]


def test_a_search_that_did_not_finish_is_not_gated_and_says_so(tmp_path):
    base = [trial(1024, MiB), trial(2048, MiB), trial(4096, MiB, status="oom"), result(2048, 4096)]
    cur = [trial(1024, MiB), trial(2048, MiB)]  # interrupted before its answer
    report = run_check(write(tmp_path / "b", base), write(tmp_path / "c", cur), Thresholds(aspects=("capacity",)))
    unfinished = [f for f in report.findings if f.aspect == "capacity" and f.verdict == "not gated"]
    assert len(unfinished) == 1 and "current search did not finish" in unfinished[0].evidence
    assert "1 not gated" in report.headline()


def point(seq_len: int, wall: list[float], cpu: list[float] | None = None, threads: int | None = 1, **fields) -> dict:
    """A timed point's row in one process: its wall-clock samples, CPU time per call, thread count."""
    row = {**COMMON, "kind": "points", "series": f"s{seq_len}", "seq_len": seq_len, "status": "ok", "message": ""}
    row |= {"times_ms": wall} | ({"cpu_times_ms": cpu} if cpu else {}) | ({"threads": threads} if threads else {})
    return row | fields


def timed(tmp_path, base: list[dict], cur: list[dict]):
    report = run_check(write(tmp_path / "b", base), write(tmp_path / "c", cur), Thresholds(aspects=("time",)))
    return report, {f.numbers["seq_len"]: f for f in report.findings if f.aspect == "time"}


def processes(seq_len: int, fastest: list[float], scale: float = 1.0, **fields) -> list[dict]:
    """One row per process, each with five calls from its fastest up (wall time = CPU time)."""
    rows = []
    for i, t in enumerate(fastest):
        calls = [scale * t * (1 + 0.01 * j) for j in range(5)]
        rows.append(point(seq_len, calls, calls, process=i, **fields))
    return rows


def test_each_point_is_judged_by_the_noise_of_its_own_processes(tmp_path):
    """A point whose processes agree is gated whatever another point's did: a run with one
    point 3x apart between processes still has its 2x slowdown at a calm point caught, and
    only the noisy point is said to be too noisy (a bar over the whole run waved both through)."""
    calm, noisy = [10.0, 10.4, 10.2], [10.0, 30.0, 12.0]
    base = processes(1024, calm) + processes(4096, noisy)
    report, found = timed(tmp_path, base, processes(1024, calm, 2.0) + processes(4096, noisy, 2.0))
    assert found[1024].verdict == "regression" and abs(found[1024].numbers["noise"] - 1.04) < 1e-9
    assert found[4096].verdict == "not gated" and "too noisy" in found[4096].evidence
    assert abs(found[4096].numbers["noise"] - 3.0) < 1e-9 and report.exit_code == 1


def test_a_cpu_point_is_compared_by_the_cpu_time_of_its_calls(tmp_path):
    """Other work on the machine stretches every call of a rerun 2.5x in wall time, not in the
    CPU time it costs: unchanged. The CPU time doubled is a regression, whatever the wall time."""
    base = [point(1024, [10.0, 10.5, 11.0, 10.2, 10.1], [9.0, 9.1, 9.2, 9.0, 9.3], process=i) for i in range(3)]
    busy = [point(1024, [25.0, 26.0, 27.0, 25.5, 25.2], [9.3, 9.2, 9.4, 9.5, 9.3], process=i) for i in range(3)]
    report, found = timed(tmp_path, base, busy)
    assert found[1024].verdict == "unchanged" and abs(found[1024].numbers["ratio"] - 9.2 / 9.0) < 1e-9
    assert found[1024].numbers["clock"] == "cpu-time" and "CPU time" in found[1024].evidence
    slower = [point(1024, r["times_ms"], [2 * x for x in r["cpu_times_ms"]], process=i) for i, r in enumerate(base)]
    report, found = timed(tmp_path / "slower", base, slower)
    assert found[1024].verdict == "regression" and abs(found[1024].numbers["ratio"] - 2.0) < 1e-9
    # a side without CPU times (rows of an older attnbench) is compared by its fastest calls' wall time
    old = [{k: v for k, v in r.items() if k != "cpu_times_ms"} for r in busy]
    report, found = timed(tmp_path / "old", base, old)
    assert found[1024].numbers["clock"] == "wall" and abs(found[1024].numbers["ratio"] - 25.0 / 10.0) < 1e-9


def test_cpu_times_at_different_thread_counts_are_not_gated(tmp_path):
    one = processes(1024, [10.0, 10.1, 10.2], threads=1)
    two = processes(1024, [5.0, 5.1, 5.2], threads=2)
    report, found = timed(tmp_path, one, two)
    assert found[1024].verdict == "not gated" and report.exit_code == 0
    assert "1 thread(s) on the baseline and 2 on the current" in found[1024].evidence
    # a count one side did not record is not held against the other's
    report, found = timed(tmp_path / "unrecorded", one, processes(1024, [20.0, 20.1, 20.2], threads=None))
    assert found[1024].verdict == "regression"


def check_row(status: str, message: str = "") -> dict:
    """A reference check of naive at 128 tokens with this outcome."""
    row = {**COMMON, "kind": "verify", "seq_len": 128, "status": status, "message": message}
    return {k: v for k, v in row.items() if k not in ("series", "label", "memory_limit", "mode")}


def test_a_reference_check_unsupported_on_both_sides_is_unchanged_and_one_that_stopped_passing_fails(tmp_path):
    """A shape the implementation declines (no grouped kernel) has no output to be wrong: the
    committed results checked against themselves failed on two such rows."""
    unsupported = check_row("unsupported", "no grouped-query kernel")

    def correctness(name, base, cur):
        report = run_check(write(tmp_path / f"{name}-b", base), write(tmp_path / f"{name}-c", cur))
        return report, [f.verdict for f in report.findings if f.aspect == "correctness"]

    report, found = correctness("same", [unsupported], [unsupported])
    assert report.exit_code == 0 and found == ["unchanged"]
    report, found = correctness("lost", [check_row("pass")], [unsupported])
    assert report.exit_code == 1 and found == ["regression"]
