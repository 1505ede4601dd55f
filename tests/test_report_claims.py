"""The seed claims table: complete against the claims file, each verdict from fixture rows
(values computed by hand here), and every command the report suggests for missing data runs."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.report import claims as cl
from attnbench.report.document import Machine
from attnbench.report.fit import GIB
from attnbench.schema import SCHEMA_VERSION

ENV = {"machine": "GPU box", "date": "2026-11-23T10:00:00+00:00", "commit": "abc"}


def claim(cid: str) -> cl.Claim:
    return next(c for c in cl.load_claims() if c.id == cid)


def speedup_row(
    strategy: str,
    times: list[float],
    world: int,
    batch: int = 1,
    seq_len: int = 16384,
    gpu_bytes: tuple[int, ...] = (80_000_000, 0),
    date: str = ENV["date"],
) -> dict:
    return {
        "schema": SCHEMA_VERSION,
        "kind": "speedup",
        "case": f"{seq_len}x{batch}",
        "message": "",
        "key": f"{strategy}:{seq_len}x{batch}",
        "strategy": strategy,
        "world_size": world,
        "impl": "dilated",
        "config": {"segment_lengths": [1024, 2048], "dilation_rates": [1, 2]},
        "batch": batch,
        "seq_len": seq_len,
        "heads": 8,
        "head_dim": 64,
        "dtype": "bf16",
        "device": "cuda",
        "mode": "fwd",
        "causal": False,
        "status": "ok",
        "times_ms": times,
        "time_ms": sorted(times)[len(times) // 2],
        "gpus": [{"index": i, "max_memory_allocated": b} for i, b in enumerate(gpu_bytes[:world])],
        "run": "r",
        "env": {**ENV, "date": date},
    }


def point(
    seq_len: int,
    config: dict,
    *,
    tokens_per_s: float | None = None,
    peak: float | None = None,
    reserved: float | None = None,
    dtype: str = "fp32",
    series: str = "s",
) -> dict:
    return {
        "schema": SCHEMA_VERSION,
        "kind": "points",
        "run": "r",
        "label": series,
        "message": "",
        "series": series,
        "impl": "dilated",
        "config": config,
        "batch": 1,
        "seq_len": seq_len,
        "heads": 8,
        "head_dim": 64,
        "dtype": dtype,
        "device": "cuda",
        "mode": "fwd",
        "causal": False,
        "status": "ok",
        "time_ms": 10.0,
        "times_ms": [10.0] * 5,
        "tokens_per_s": tokens_per_s,
        "peak_bytes": peak,
        "max_memory_reserved": reserved,
        "env": ENV,
        "gpus": [
            {
                "index": 0,
                "max_memory_reserved": reserved,
                "max_memory_allocated": reserved,
                "nvml_used_before": 0,
                "nvml_used_peak": reserved + 500e6 if reserved else None,
            }
        ],
        "device_total_bytes": 80 * GIB,
    }


def verdict_of(cid: str, rows: list[dict]) -> cl.Verdict:
    return cl.verdicts([Machine("GPU box", rows)], [claim(cid)])[0]


# --- the claims file ----------------------------------------------------------------------------


def test_claims_file_loads_with_unique_ids_and_a_matcher_for_every_testable_claim():
    claims = cl.load_claims()
    assert len({c.id for c in claims}) == len(claims) > 80
    for c in claims:
        assert c.seed in ("000", "001", "002", "003", "004") and c.id.startswith(c.seed)
        assert c.test == "none" or c.match, c.id
        assert c.test != "none" or c.note, c.id


def test_a_malformed_claims_file_is_one_line_error(tmp_path):
    bad = tmp_path / "claims.toml"
    bad.write_text(
        '[[claim]]\nid = "x"\nseed = "000"\nsays = "s"\nvalue = 1\nunit = "x"\nworkload = "w"\n'
        'gpus = 1\nmetric = "speed"\ntest = "none"\n'
    )
    with pytest.raises(cl.AttnbenchError, match="metric must be one of"):
        cl.load_claims(bad)


def test_the_report_table_holds_every_claim_exactly_once(tmp_path):
    from attnbench.report.build import render
    from attnbench.report.data import load

    rows = [speedup_row("single", [30.0] * 5, 1), speedup_row("dp", [45.0] * 5, 2)]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    doc = render(load(tmp_path))
    table = dict(doc.tables)["seed-claims.csv"]
    ids = [r["Id"] for r in table.records]
    assert sorted(ids) == sorted(c.id for c in cl.load_claims())
    assert all(r["Verdict"] in (cl.CONFIRMED, cl.REFUTED, cl.NOT_COMPARABLE, cl.NOT_MEASURED) for r in table.records)
    text = doc.text()
    assert text.index("## Seed claims vs measured") < text.index("## Findings") < text.index("## Executive summary")


# --- verdicts from rows -------------------------------------------------------------------------


def test_a_speedup_above_one_confirms_a_claim_of_benefit():
    # single 100 ms, DataParallel 50 ms: 2.0x; a resampled median ratio lies between the extreme
    # ratios 98/51 and 102/49, so the interval stays above 1
    rows = [speedup_row("single", [98.0, 100.0, 102.0], 1), speedup_row("dp", [49.0, 50.0, 51.0], 2)]
    v = verdict_of("001-dp-16k-speedup", rows)
    assert v.verdict == cl.CONFIRMED
    assert v.measured.value == pytest.approx(2.0)
    assert 98.0 / 51.0 <= v.measured.low <= 2.0 <= v.measured.high <= 102.0 / 49.0


def test_batch_one_data_parallel_refutes_the_speedup_and_says_why():
    rows = [speedup_row("single", [29.0, 30.0, 31.0], 1), speedup_row("dp", [44.0, 45.0, 46.0], 2)]
    v = verdict_of("001-dp-16k-speedup", rows)
    assert v.verdict == cl.REFUTED and v.measured.value == pytest.approx(30.0 / 45.0)
    assert "batch 1: DataParallel ran 1 replica, GPU 1 idle" in v.why


def test_an_interval_that_includes_the_threshold_is_marked_not_a_verdict():
    rows = [speedup_row("single", [40.0, 50.0, 60.0], 1), speedup_row("dp", [40.0, 50.0, 60.0], 2)]
    v = verdict_of("001-dp-16k-speedup", rows)
    assert v.verdict == cl.NOT_COMPARABLE and "anomaly: interval includes 1" in v.why


def test_the_newest_row_measures_and_supersedes_older_ones():
    rows = [
        speedup_row("single", [30.0] * 3, 1),
        speedup_row("dp", [45.0] * 3, 2, date="2026-01-01"),
        speedup_row("dp", [15.0] * 3, 2, date="2026-12-01"),
    ]
    v = verdict_of("001-dp-16k-speedup", rows)
    assert v.measured.value == pytest.approx(2.0) and "supersedes 1 older row" in v.why


def test_claims_without_rows_are_not_measured_yet_and_say_what_measures_them():
    two = verdict_of("001-dp-16k-speedup", [])
    assert (two.verdict, two.why) == (cl.NOT_MEASURED, "needs two GPUs")
    one = verdict_of("003-impact-dilation-2", [])
    assert one.verdict == cl.NOT_MEASURED and "attnbench run --profile seeds" in one.why


def test_a_ratio_claim_confirms_or_refutes_from_two_rows():
    base = {"segment_lengths": [4096], "dilation_rates": [1]}
    dil = {"segment_lengths": [4096], "dilation_rates": [2]}
    near = [point(237568, base, tokens_per_s=10_000, series="a"), point(237568, dil, tokens_per_s=56_000, series="b")]
    v = verdict_of("003-impact-dilation-2", near)
    assert v.verdict == cl.CONFIRMED and v.measured.value == pytest.approx(5.6)
    far = [point(237568, base, tokens_per_s=10_000, series="a"), point(237568, dil, tokens_per_s=39_300, series="b")]
    v = verdict_of("003-impact-dilation-2", far)
    assert v.verdict == cl.REFUTED and v.measured.value == pytest.approx(3.93)


def test_memory_is_compared_but_absolute_speed_is_not():
    cfg = {"segment_lengths": [4096], "dilation_rates": [1]}
    rows = [point(237568, cfg, tokens_per_s=2e6, peak=4.4e9)]
    assert verdict_of("003-memory-no-dilation", rows).verdict == cl.CONFIRMED  # 4.4 / 4.53 = 0.97
    assert verdict_of("003-memory-no-dilation", [point(237568, cfg, peak=9e9)]).verdict == cl.REFUTED
    speed = verdict_of("003-throughput-no-dilation", rows)
    assert speed.verdict == cl.NOT_COMPARABLE and "not of a GTX 1080" in speed.why


def test_the_8_gib_capacity_comes_from_the_fit_of_the_series():
    # reserved = 1e9 + 20,000 N, NVML sees 0.5e9 more: an 8 GiB GPU holds (8 GiB - 0.5e9 - 1e9) / 20,000
    cfg = {"segment_lengths": [4096], "dilation_rates": [1]}
    rows = [point(n, cfg, reserved=1e9 + 20_000 * n) for n in (65536, 131072, 262144, 524288)]
    v = verdict_of("003-max-no-dilation", rows)
    expected = (8 * GIB - 0.5e9 - 1e9) / 20_000
    assert v.measured.value == pytest.approx(expected, rel=1e-6)
    assert v.verdict == (cl.CONFIRMED if abs(expected / 237568 - 1) <= 0.25 else cl.REFUTED)


def test_theory_and_arithmetic_are_not_comparable_with_the_reason():
    v = verdict_of("000-sparse-times-gpus", [])
    assert v.verdict == cl.NOT_COMPARABLE and "arithmetic" in v.why


def test_an_efficiency_above_one_never_headlines():
    from attnbench.report.findings import machine_findings

    rows = [
        speedup_row("single", [100.0] * 3, 1, batch=8),
        speedup_row("mp", [20.0] * 3, 2, batch=8),
        speedup_row("single", [100.0] * 3, 1, batch=8, seq_len=8192),
        speedup_row("mp", [60.0] * 3, 2, batch=8, seq_len=8192),
    ]
    lines = machine_findings(Machine("GPU box", rows), [], [])
    best = next(line for line in lines if "Best speedup" in line)
    assert "1.67x" in best
    assert any(line.startswith("- Anomaly: 5.00x with efficiency 2.50") for line in lines)


# --- every command the report suggests runs --------------------------------------------------------

# Appended so a suggestion runs on this CPU in seconds: same command, smaller work.
CPU_SMALL = {
    "bench": ["--device", "cpu", "--dtype", "fp32", "--heads", "2", "--head-dim", "8", "--seq-lens", "2K"],
    "max-seq": [
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--heads",
        "2",
        "--head-dim",
        "8",
        "--start",
        "2K",
        "--max-seq-len",
        "4K",
        "--resolution",
        "2K",
    ],
    "speedup": ["--device", "cpu", "--dtype", "fp32", "--heads", "2", "--head-dim", "8", "--cases", "4096x2"],
}
SMALL_SEGMENTS = ["--segment-lengths", "512,1024", "--dilation-rates", "1,2"]


def small(command: str) -> list[str] | None:
    words = shlex.split(command)[1:]
    if words[0] not in CPU_SMALL:
        return None
    if "--segment-lengths" in words:
        i = words.index("--segment-lengths")
        del words[i : i + 2]
        j = words.index("--dilation-rates")
        del words[j : j + 2]
        words += SMALL_SEGMENTS
    if "--seq-lens" in words:
        i = words.index("--seq-lens")
        del words[i : i + 2]
    return words + CPU_SMALL[words[0]]


@pytest.mark.slow
@pytest.mark.parametrize("producer", sorted(__import__("attnbench.report.document", fromlist=["PRODUCERS"]).PRODUCERS))
def test_every_suggested_command_runs_small_on_the_cpu(producer, tmp_path):
    from attnbench.report.document import PRODUCERS

    argv = small(PRODUCERS[producer])
    if argv is None:  # `run --profile NAME`: the profile's own plan; building it is what can fail off a GPU
        from attnbench.plan import build_plan

        words = shlex.split(PRODUCERS[producer])
        profile = words[words.index("--profile") + 1]
        build_plan(profile, [], {}, {}, "default-cpu" if profile == "auto" else profile)
        return
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "attnbench", *argv, "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (out / "trials.jsonl").exists()


def test_speedup_tables_mark_anomalies_beside_the_number():
    from attnbench.report.multigpu import speedup_cases
    from attnbench.report.sections.data_parallel import speedup_notes

    # 100 ms over 20 ms on 2 GPUs: 5x, efficiency 2.5; 50 ms over [40, 50, 60]: the interval crosses 1
    rows = [
        speedup_row("single", [100.0] * 3, 1, batch=8),
        speedup_row("mp", [20.0] * 3, 2, batch=8),
        speedup_row("single", [50.0] * 3, 1, batch=8, seq_len=8192),
        speedup_row("mp", [40.0, 50.0, 60.0], 2, batch=8, seq_len=8192),
    ]
    notes = {c["seq_len"]: speedup_notes(c) for c in speedup_cases(rows)}
    assert notes[16384] == "anomaly: efficiency 2.50 above 1"
    assert notes[8192] == "anomaly: interval includes 1"
