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
