"""`attnbench check` on real reruns of the same command on a busy CPU, committed as fixtures
(tests/fixtures/cpu-gate/, README.md there says how they were made): identical runs pass
against each other, and a copy of a run with every time sample doubled fails. The same for the
README's CPU max-seq search under a memory limit, whose memory the gate judges by the tensor
bytes a call held (exact run to run), not by resident-set growth (tens of MiB apart).

The bench runs are three `attnbench bench --repeat 3` of sdpa and dilated at 1K and 4K, fp32,
made one after another on the project's 2-core machine while other work ran on it (one of
them while a profile of the report ran beside it): three pairs, three doubled copies. Nothing
about their timings is made up; the fixtures replace live reruns, whose outcome would depend
on the load of the machine running the tests.
"""

import itertools
import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, main_in_process

FIXTURES = ROOT / "tests" / "fixtures" / "cpu-gate"
RUNS = [FIXTURES / f"run{i}" for i in (1, 2, 3)]
SEARCHES = [FIXTURES / f"search{i}" for i in (1, 2, 3)]
POINTS = 4  # sdpa and dilated at 1K and 4K
SAMPLES = ("times_ms", "cpu_times_ms")


@pytest.fixture
def check(capsys):
    """The README's check line through the console entry point, with JSON to read the verdicts."""

    def run(*args) -> tuple[int, dict]:
        code = main_in_process("check", *map(str, args), "--format", "json")
        out, err = capsys.readouterr()
        assert code in (0, 1), err
        return code, json.loads(out)

    return run


def time_findings(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["aspect"] == "time"]


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines()]


def test_the_fixtures_are_three_real_runs_of_three_processes_a_point_at_one_thread():
    for run in RUNS:
        points = [r for r in rows(run) if r["kind"] == "points"]
        assert len(points) == 3 * POINTS and {r["process"] for r in points} == {0, 1, 2}
        assert all(r["threads"] == 1 and len(r["cpu_times_ms"]) == len(r["times_ms"]) for r in points)
        assert len({r["env"]["machine"] for r in points}) == 1


@pytest.mark.parametrize("base, cur", list(itertools.combinations(RUNS, 2)), ids=lambda p: p.name)
def test_identical_runs_pass(check, base, cur):
    code, report = check("--baseline", base, "--current", cur)
    timed = time_findings(report)
    # every point was judged on its processes' CPU time, not waved through for want of them
    assert len(timed) == POINTS and all(f["numbers"]["clock"] == "cpu-time" for f in timed)
    assert not [f for f in timed if f["verdict"] == "not gated"], timed
    assert code == 0 and report["result"] == "pass", [(f["trial"], f["verdict"], f["change"]) for f in timed]


def doubled(run: Path, out: Path) -> Path:
    """A copy of ``run`` with every time sample (wall and CPU time) multiplied by 2."""
    shutil.copytree(run, out)
    copy = rows(out)
    for r in copy:
        for key in SAMPLES:
            if r.get(key):
                r[key] = [2 * x for x in r[key]]
    (out / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in copy))
    return out


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_a_copy_with_every_time_sample_doubled_fails(check, run, tmp_path):
    code, report = check("--baseline", run, "--current", doubled(run, tmp_path / "doubled"))
    timed = time_findings(report)
    assert code == 1 and report["result"] == "fail"
    assert [f["verdict"] for f in timed] == ["regression"] * POINTS, [(f["trial"], f["evidence"]) for f in timed]
    assert all(f["numbers"]["ratio"] == pytest.approx(2.0) for f in timed)


@pytest.mark.parametrize("base, cur", list(itertools.combinations(SEARCHES, 2)), ids=lambda p: p.name)
def test_identical_cpu_searches_pass(check, base, cur):
    code, report = check("--baseline", base, "--current", cur)
    memory = [f for f in report["findings"] if f["aspect"] == "memory"]
    # each length both searches ran is judged, by the exact count, and found unchanged
    assert memory and all(f["numbers"]["counter"] == "cpu.tensor_peak_bytes" for f in memory), memory
    assert all(f["verdict"] == "unchanged" for f in memory)
    moved = [(f["aspect"], f["verdict"]) for f in report["findings"] if f["verdict"] not in ("unchanged", "not gated")]
    assert code == 0, moved
