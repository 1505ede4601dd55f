"""The two published packages of examples/, as a user installs them: local-attention's
windows (one device) and ring-attention-pytorch's ring (sequence parallel, 2 gloo processes).
The packages themselves come from the package index with the test extra (pinned releases);
the adapters are pip-installed here into a directory of their own, then listed, verified
against the float64 reference, searched or benched, and reported with the adapters no longer
importable (a report reads rows only)."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

from attnbench.results import read_rows

from conftest import ROOT, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.distributed]
EXAMPLES = ("attnbench-local-attention", "attnbench-ring-attention")
CPU = ["--device", "cpu", "--dtype", "fp32", "--heads", 2, "--head-dim", 16]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    sources = []
    for name in EXAMPLES:
        source = tmp_path_factory.mktemp("src") / name
        shutil.copytree(ROOT / "examples" / name, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        sources.append(str(source))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target)]
    subprocess.run([*pip, *sources], check=True, capture_output=True, timeout=600)
    return {"PYTHONPATH": f"{ROOT}{os.pathsep}{target}"}


def test_both_are_listed_with_their_package(installed):
    r = run_cli("list", env=installed)
    assert r.returncode == 0, r.stderr
    assert "package attnbench-local-attention 0.1.0" in r.stdout
    assert "package attnbench-ring-attention 0.1.0" in r.stdout


def test_local_attention_verified_searched_and_reported(installed, tmp_path, in_process):
    v = run_cli("verify", "--impl", "local-attention", "--device", "cpu", env=installed)
    assert v.returncode == 0, v.stdout + v.stderr
    # checked where its windows hold under half the pairs, not only inside one window
    assert "pass" in v.stdout and "N 128-1024" in v.stdout
    out = tmp_path / "runs" / "local"
    # a limit the windows pass at 1024 (13 MiB) and about reach at 2048 (26-31 MiB): a few trials, each timed 1 s
    m = run_cli("max-seq", "--impl", "local-attention", "--param", "window_size=64", *CPU, "--start", 1024,
                "--memory-limit", "32MiB", "--resolution", 512, "--timing-budget", 1, "--max-trial-seconds", 10,
                "--out", out, env=installed)  # fmt: skip
    assert m.returncode == 0, m.stdout + m.stderr
    rows, problems = read_rows(out)
    assert problems == []
    ok = [r for r in rows if r["kind"] == "max-seq" and r["status"] == "ok"]
    assert ok and all(r["verified"] and r["impl_source"]["package"] == "attnbench-local-attention" for r in ok)
    for r in ok:  # its pairs from its mask_mod, counted by tiles; its executed pairs as it declares them
        n, windows = r["seq_len"], 64 * 3
        assert r["pairs_counted"] == "blocks" and r["pairs_executed"] == 2 * n * windows
        assert r["pairs_useful"] < r["pairs_executed"]
    (result,) = [r for r in rows if r["kind"] == "max-seq-result"]
    assert result["seq_len"] > 1024
    assert importlib.util.find_spec("attnbench_local_attention") is None  # nor can this process: a report reads rows
    rep = in_process("report", out)
    assert rep.returncode == 0, rep.stderr
    md = (out / "report" / "report.md").read_text()
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections[0].startswith("## The answer") and sections[1] == "## Your implementations"


def test_ring_attention_pytorch_on_two_gloo_ranks_verified_benched_and_reported(installed, tmp_path, in_process):
    v = run_cli("verify", "--impl", "ring-attention-pytorch", "--param", "striped=true", "--gpus", 2,
                "--device", "cpu", env=installed)  # fmt: skip
    assert v.returncode == 0, v.stdout + v.stderr
    assert "2/2 checks" in v.stdout  # causal and not, on 2 ranks, against the reference and sdpa
    runs = tmp_path / "runs"
    b = run_cli("bench", "--impl", "ring-attention-pytorch", "--seq-lens", 2048, "--gpus", "1,2", *CPU,
                "--timing-budget", 1, "--max-trial-seconds", 30, "--out", runs / "ring", env=installed)  # fmt: skip
    assert b.returncode == 0, b.stdout + b.stderr
    s = in_process("bench", "--impl", "sdpa", "--seq-lens", 2048, *CPU, "--timing-budget", 1, "--out", runs / "one")
    assert s.returncode == 0, s.stderr
    rows, _ = read_rows(runs / "ring")
    points = sorted((r for r in rows if r["kind"] == "points"), key=lambda r: r["world_size"])
    assert [(r["world_size"], r["status"]) for r in points] == [(1, "ok"), (2, "ok")]
    assert all(r["impl_source"]["sequence_parallel"]["counterpart"] == "sdpa" for r in points)
    assert points[1]["pairs_useful"] == 2 * 2048 * 2048  # dense: its counterpart's pairs
    assert importlib.util.find_spec("attnbench_ring_attention") is None
    rep = in_process("report", runs, "--out", tmp_path / "report")
    assert rep.returncode == 0, rep.stderr
    (vs,) = [p.read_text() for p in (tmp_path / "report" / "csv").glob("ring-vs-one-device-*.csv")]
    assert "ring-attention-pytorch" in vs and "equal work: sdpa" in vs
