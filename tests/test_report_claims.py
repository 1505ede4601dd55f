"""The seed claims and the verdict rule: the claims file is complete and consistent, every verdict
follows the one rule of docs/design/verdicts.md from rows whose values are worked out by hand here, and
every command the report suggests for missing data runs."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.report.document import Machine
from attnbench.report.fit import GIB
from attnbench.report.seeds import claims as cl
from attnbench.report.seeds import verdicts as v
from attnbench.report.seeds.measured import Measured
from attnbench.results.schema import SCHEMA_VERSION

from conftest import typed_row

ENV = {"machine": "GPU box", "date": "2026-11-23T10:00:00+00:00", "commit": "abc"}


def claim(cid: str) -> cl.Claim:
    return next(c for c in cl.load_claims() if c.id == cid)


def made_up(**fields) -> cl.Claim:
    """A claim of the tests' own: a speedup of 0.16x, slower than one GPU unless said otherwise."""
    base = dict(
        id="t",
        seed="001",
        says="s",
        value=0.16,
        unit="x",
        workload="w",
        gpus=2,
        metric="speedup",
        match={"strategy": "dp"},
    )
    return cl.Claim(**{**base, **fields})


def speedup_row(
    strategy: str,
    times: list[float],
    world: int,
    batch: int = 1,
    seq_len: int = 16384,
    gpu_bytes: tuple[int, ...] = (80_000_000, 0),
    date: str = ENV["date"],
    host: float | None = 0.01,
    **fields,
):
    """A bf16 speedup case's row; ``host``: the share of its eager time the host took (a GPU-bound
    call by default, so a speed ratio's size is judged)."""
    return typed_row(
        kind="speedup",
        case=f"{seq_len}x{batch}",
        key=f"{strategy}:{seq_len}x{batch}:{date}",
        strategy=strategy,
        world_size=world,
        config={"segment_lengths": [1024, 2048], "dilation_rates": [1, 2]},
        batch=batch,
        seq_len=seq_len,
        times_ms=times,
        time_ms=sorted(times)[len(times) // 2],
        gpus=[{"index": i, "max_memory_allocated": b} for i, b in enumerate(gpu_bytes[:world])],
        env={**ENV, "date": date},
        dispatch_share=host,
        **{"mode": "fwd", **fields},
    )


def point(seq_len: int, config: dict, *, series: str = "s", dtype: str = "fp32", **fields):
    reserved = fields.pop("reserved", None)
    return typed_row(
        series=series,
        label=series,
        config=config,
        seq_len=seq_len,
        dtype=dtype,
        mode="fwd",
        max_memory_reserved=reserved,
        gpus=[
            {
                "index": 0,
                "max_memory_reserved": reserved,
                "max_memory_allocated": reserved,
                "nvml_used_before": 0,
                "nvml_used_peak": reserved + 500_000_000 if reserved else None,
            }
        ],
        device_total_bytes=80 * GIB,
        env=ENV,
        **{"time_ms": 10.0, "times_ms": [10.0] * 5, "dispatch_share": 0.01, **fields},  # GPU-bound unless said
    )


def verdict_of(c: cl.Claim | str, rows: list) -> v.Verdict:
    c = claim(c) if isinstance(c, str) else c
    return v.verdicts([Machine("GPU box", rows)], [c])[0]


# --- the claims file ----------------------------------------------------------------------------


def test_claims_file_loads_with_unique_ids_a_matcher_or_a_reason_for_every_claim():
    claims = cl.load_claims()
    assert len({c.id for c in claims}) == len(claims) > 100
    for c in claims:
        assert c.seed in ("000", "001", "002", "003", "004") and c.id.startswith(c.seed)
        assert c.match if c.comparable else c.note, c.id
        assert c.metric in cl.METRICS
    per_seed = {s: sum(c.seed == s for c in claims) for s in ("000", "001", "002", "003", "004")}
    assert all(n >= 8 for n in per_seed.values()), per_seed


SEED_000 = '[[seed]]\nid = "000"\ndtype = "bf16"\nwhy = "w"\nshape_stated = false\n'
CLAIM_X = '[[claim]]\nid = "x"\nseed = "000"\nsays = "s"\nvalue = 1\nunit = "x"\nworkload = "w"\ngpus = 1\n'


def test_a_malformed_claims_file_is_one_line_error(tmp_path):
    bad = tmp_path / "claims.toml"
    for text, error in (
        (SEED_000 + CLAIM_X + 'metric = "speed"\ncomparable = false\nnote = "n"\n', "metric must be one of"),
        (SEED_000 + CLAIM_X + 'metric = "time_ms"\ncomparable = false\n', "says why in its note"),
        (CLAIM_X + 'metric = "time_ms"\ncomparable = false\nnote = "n"\n', "seed 000 has no \\[\\[seed\\]\\] entry"),
        (
            SEED_000.replace("bf16", "fp64") + CLAIM_X + 'metric = "time_ms"\ncomparable = false\nnote = "n"\n',
            "dtype must",
        ),
    ):
        bad.write_text(text)
        with pytest.raises(cl.AttnbenchError, match=error):
            cl.load_claims(bad)


def test_seeds_md_and_its_csv_hold_every_claim_exactly_once_by_seed_report(tmp_path):
    from attnbench.report.build import render
    from attnbench.report.data import load

    rows = [speedup_row("single", [30.0] * 5, 1), speedup_row("dp", [45.0] * 5, 2)]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    doc = render(load(tmp_path))
    table = dict(doc.tables)["seed-claims.csv"]
    assert sorted(r["Id"] for r in table.records) == sorted(c.id for c in cl.load_claims())
    assert all(r["Verdict"] in v.VERDICTS for r in table.records)
    seeds = doc.files["seeds.md"]
    for c in cl.load_claims():
        assert seeds.count(f"| {c.says} |") == 1, c.id
    headings = [line for line in seeds.splitlines() if line.startswith("## ")]
    assert [h[3:6] for h in headings] == ["000", "001", "002", "003", "004"]
    assert "[seeds.md](seeds.md)" in doc.text()


# --- the rule, claim by claim -----------------------------------------------------------------------


def test_size_agrees_within_a_factor_of_1_25_of_the_seeds_range():
    c = made_up(value=4.5, unit="GB", metric="peak_bytes", match={"seq_len": 1024}, gpus=1)
    # 4.5 printed with one decimal stands for 4.45-4.55 GB; times 1.25 either way: 3.56-5.6875 GB
    for peak, expected in ((5_680_000_000, v.CONFIRMED), (3_570_000_000, v.CONFIRMED), (5_700_000_000, v.REFUTED)):
        got = verdict_of(c, [point(1024, {}, peak_bytes=peak)])
        assert got.verdict == expected, peak
    assert "within a factor of 1.25" in verdict_of(c, [point(1024, {}, peak_bytes=4_500_000_000)]).why


def test_the_seeds_rounding_widens_its_range_and_a_coarse_number_is_not_tested_by_size():
    c = made_up(value=0.03, unit="GB", metric="inputs_bytes", match={"seq_len": 1024}, gpus=1)
    # 0.03 GB stands for 0.025-0.035 GB: 0.021 GB is within 1.25 of 0.025 (0.02), 0.019 GB is not
    assert verdict_of(c, [point(1024, {}, inputs_bytes=21_000_000)]).verdict == v.CONFIRMED
    assert verdict_of(c, [point(1024, {}, inputs_bytes=19_000_000)]).verdict == v.REFUTED
    # 0.01 GB stands for 0.005-0.015 GB, ±50%: coarser than the tolerance, whatever was measured
    coarse = made_up(value=0.01, unit="GB", metric="inputs_bytes", match={"seq_len": 1024}, gpus=1)
    for measured in (6_000_000, 10_000_000):
        got = verdict_of(coarse, [point(1024, {}, inputs_bytes=measured)])
        assert got.verdict == v.NOT_COMPARABLE and "rounded to ±50%" in got.why
    # a trailing zero the seed printed narrows it: 0.10 GB is 0.095-0.105 GB
    assert made_up(value=0.1, printed="0.10", unit="GB").seed_range == pytest.approx((0.095e9, 0.105e9))


def test_direction_and_magnitude_are_judged_apart():
    # single 100 ms over DataParallel 6,000-6,400 ms: a speedup near 0.016, below 1 as the seed
    # says (0.16x), but a tenth of its size
    rows = [speedup_row("single", [99.0, 100.0, 101.0], 1), speedup_row("dp", [6000.0, 6200.0, 6400.0], 2)]
    slower = made_up(direction="below:1")
    got = verdict_of(slower, rows)
    assert got.verdict == v.DIRECTION_ONLY and got.measured.value == pytest.approx(100 / 6200)
    assert "below 1x as the seed says" in got.why
    # the same rows against a claim of benefit: the direction is wrong
    assert verdict_of(made_up(value=1.29, direction="above:1"), rows).verdict == v.REFUTED
    # a size that agrees and a direction that holds
    near = [speedup_row("single", [99.0, 100.0, 101.0], 1), speedup_row("dp", [600.0, 620.0, 640.0], 2)]
    assert verdict_of(slower, near).verdict == v.CONFIRMED


def test_an_interval_that_spans_the_threshold_is_inconclusive_or_refuted_by_its_size():
    # one call over another, both 40-60 ms: a ratio near 1 whose interval spans 1
    spread = dict(times_ms=[40.0, 50.0, 55.0, 60.0, 45.0], time_ms=50.0)
    rows = [point(8192, {}, impl="a", series="a", **spread), point(8192, {}, impl="b", series="b", **spread)]
    ratio = dict(metric="time_ms", match={"impl": "a"}, over={"impl": "b"}, direction="above:1", gpus=1)
    assert verdict_of(made_up(value=1.1, **ratio), rows).verdict == v.INCONCLUSIVE
    assert verdict_of(made_up(value=2.21, **ratio), rows).verdict == v.REFUTED  # not 2.21 at any point of it
    # a speedup case whose interval includes 1 is one the speedup tables flag: it settles nothing
    cases = [speedup_row("single", [40.0, 50.0, 60.0], 1), speedup_row("dp", [40.0, 50.0, 60.0], 2)]
    for value in (1.1, 2.21):
        got = verdict_of(made_up(value=value, direction="above:1"), cases)
        assert got.verdict == v.INCONCLUSIVE and "(anomaly: interval includes 1)" in got.why


def search(lengths: list[int], failed: int | None, *, series: str = "a", cfg: dict | None = None, **fields) -> list:
    """A finished max-seq search: trials that ran at ``lengths``, one out of memory at ``failed``
    (None: the search stopped at its cap), and its result row."""
    cfg = cfg or {}
    rows = [point(n, cfg, kind="max-seq", series=series, **fields) for n in lengths]
    if failed:
        rows.append(point(failed, cfg, kind="max-seq", series=series, status="oom", **fields))
    result = dict(
        seq_len=max(lengths),
        config=cfg,
        dtype=fields.get("dtype", "fp32"),
        env=ENV,
        memory_limit=fields.get("memory_limit"),
    )
    return rows + [typed_row(kind="max-seq-result", series=series, **result)]


def test_a_claim_whose_number_is_its_threshold_is_judged_by_its_side():
    c = made_up(value=2_000_000, unit="tokens", metric="max_seq", match={"impl": "dilated"}, direction="above:2000000")
    assert verdict_of(c, search([1 << 20, 1 << 22], 1 << 23)).verdict == v.CONFIRMED  # 4M tokens: any size above 2M
    assert verdict_of(c, search([1 << 20], 1 << 21)).verdict == v.REFUTED  # memory stopped it at 1M
    # a search that never finished ran 1M: at least 1M, which neither reaches nor rules out 2M
    unfinished = [point(1 << 20, {}, kind="max-seq", series="a")]
    assert verdict_of(c, unfinished).verdict == v.INCONCLUSIVE


def test_a_zero_the_seed_printed_is_matched_within_its_rounding():
    c = claim("002-dp-gpu1-idle")  # 0.00 GB: below 5 MB is zero to the seed's two decimals
    idle = [speedup_row("dp", [10.0] * 3, 2, gpu_bytes=(80_000_000, 0))]
    busy = [speedup_row("dp", [10.0] * 3, 2, gpu_bytes=(80_000_000, 40_000_000))]
    assert verdict_of(c, idle).verdict == v.CONFIRMED and verdict_of(c, busy).verdict == v.REFUTED


def test_absolute_speed_is_never_compared_even_where_measured():
    cfg = {"segment_lengths": [4096], "dilation_rates": [1]}
    got = verdict_of("003-throughput-no-dilation", [point(237568, cfg, tokens_per_s=2e6, heads=8, head_dim=64)])
    assert got.verdict == v.NOT_COMPARABLE and "GTX 1080" in got.why and got.measured is not None
    unmeasured = verdict_of("004-ring-8k-time", [])
    assert unmeasured.verdict == v.NOT_COMPARABLE and unmeasured.measured is None


def test_claims_without_rows_say_where_their_rows_come_from():
    two = verdict_of("001-dp-2k-speedup", [])
    assert two.verdict == v.NOT_MEASURED
    assert two.why.startswith(
        "needs two GPUs: `attnbench run --profile multi-gpu`; speedup over one GPU: two GTX 1080s"
    )
    one = verdict_of("002-dp-64k-gpu0", [])  # batch-1 DataParallel: one GPU holds everything
    assert one.verdict == v.NOT_MEASURED and "attnbench run --profile seeds" in one.why
    # where no profile runs it at the seed's terms, the claim names the command that does
    ring = verdict_of("004-ring-overhead", [])  # fp32, seed 004's dtype, on two GPUs
    assert ring.verdict == v.NOT_MEASURED and ring.why.startswith("needs the ring on two GPUs in fp32")
    assert "`attnbench bench --impl ring-dilated --gpus 2 --dtype fp32" in ring.why


def test_a_ratio_claim_is_measured_from_two_rows():
    base = {"segment_lengths": [4096], "dilation_rates": [1]}
    dil = {"segment_lengths": [4096], "dilation_rates": [2]}
    rows = [point(237568, base, tokens_per_s=10_000, series="a"), point(237568, dil, tokens_per_s=39_300, series="b")]
    got = verdict_of("003-impact-dilation-2", rows)  # 5.8x: 4.64-7.25 agrees, 3.93 does not
    assert got.verdict == v.REFUTED and got.measured.value == pytest.approx(3.93)
    rows[1] = point(237568, dil, tokens_per_s=48_000, series="b")
    assert verdict_of("003-impact-dilation-2", rows).verdict == v.CONFIRMED


def test_memory_is_compared_on_the_quantity_the_seed_counted():
    # the seed's 64.1 MB at 64K is one fp16 tensor: what the call adds beyond q, k and v
    rows = [point(65536, {}, dtype="fp16", impl="sdpa", peak_bytes=268_435_456, inputs_bytes=201_326_592)]
    got = verdict_of("002-base-64k-dense-memory", rows)
    assert got.measured.value == 67_108_864 and got.verdict == v.CONFIRMED


def test_the_8_gib_capacity_is_a_search_under_that_limit_and_a_fit_only_predicts_it():
    # reserved = 1e9 + 20,000 N, NVML sees 0.5e9 more: the fit puts 8 GiB at (8 GiB - 1.5e9) / 20,000,
    # 354,496 tokens (346.2K): a prediction, never a verdict
    cfg = {"segment_lengths": [4096], "dilation_rates": [1]}
    fitted = [point(n, cfg, reserved=1_000_000_000 + 20_000 * n) for n in (65536, 131072, 262144, 524288)]
    got = verdict_of("003-max-no-dilation", fitted)
    assert (got.verdict, got.measured) == (v.NOT_MEASURED, None)
    assert "fit of 4 trials solved for 8 GiB on GPU box predicts about 346.2K, a prediction" in got.why
    assert "attnbench run --profile seeds-8gib" in got.why
    # a search under 8 GiB that memory stopped at 262,144 (393,216 ran out): 1.1x the seed's 237,568
    limited = search([131072, 262144], 393216, series="l", cfg=cfg, memory_limit=8 * GIB)
    got = verdict_of("003-max-no-dilation", fitted + limited)
    assert (got.verdict, got.measured.value, got.measured.bound) == (v.CONFIRMED, 262144, False)
    assert got.why.endswith(
        "longest sequence in 8 GB: one GTX 1080 (8 GB) against GPU box under an allocator limit of 8 GiB; "
        "assumed H=8, D=64 (the seed states neither)"
    )


def test_a_search_stopped_by_its_cap_is_a_lower_bound():
    # 002's ring variant: 65,536 ran and 131,072 did not, so the seed's largest is 65,536-131,072,
    # agreeing up to 131,072 x 1.25 = 163,840
    cfg = {"sparsity_ratio": 0.05, "block_size": 256}
    shape = dict(impl="block-sparse", dtype="fp16", heads=2, head_dim=32, memory_limit=8 * GIB)
    capped = search([131072, 1 << 20], None, cfg=cfg, **shape)
    got = verdict_of("002-single-max-ring", capped)
    assert got.verdict == v.REFUTED and got.measured.bound  # 1M ran: 16x the seed's 65,536 at least
    assert got.why.startswith("at least 1,048,576 (1M), at least 16x the seed's value")
    short = search([131072], None, cfg=cfg, **shape)  # 131,072 ran, the cap stopped it: could be the seed's
    assert verdict_of("002-single-max-ring", short).verdict == v.INCONCLUSIVE
    # a lower bound past a claimed minimum confirms it: the base ran 131,072 on one GPU
    base = search(
        [131072, 1 << 20], None, cfg={"sparsity_ratio": 0.01}, dtype="fp16", impl="block-sparse", memory_limit=8 * GIB
    )
    assert verdict_of("002-single-max-base", base).verdict == v.CONFIRMED


def test_standard_attention_is_the_n_by_n_one():
    # under 8 GiB a fused sdpa reaches 1M, the N x N attention stops at 11,264 by memory: the seed's
    # "standard attention runs out of memory at 32K and 65K" holds for the one it meant
    bf16 = dict(dtype="bf16", memory_limit=8 * GIB)  # seed 001's dtype
    fused = search([65536, 1 << 20], None, series="f", impl="sdpa", **bf16)
    n_by_n = search([8192, 11264], 12288, series="n", impl="naive", **bf16)
    got = verdict_of("001-standard-attention-oom", fused + n_by_n)
    assert (got.verdict, got.measured.value) == (v.CONFIRMED, 11264) and got.measured.workload.startswith("naive")
    assert verdict_of("001-standard-attention-oom", fused).verdict == v.NOT_MEASURED


def test_every_claim_of_a_seed_is_judged_in_its_one_dtype():
    # seed 002 is fp16 (its code asks for it, its DataParallel table reads so): q, k, v of H=2, D=32 at
    # 128K are 3 x 131,072 x 64 x 2 = 50,331,648 bytes, half the seed's 0.10 GB (what fp32 would hold);
    # an fp32 row, though it matches the seed's number, never measures a claim of seed 002
    shape = dict(impl="block-sparse", heads=2, head_dim=32)
    fp32 = point(131072, {}, dtype="fp32", inputs_bytes=100_663_296, series="b", **shape)
    assert verdict_of("002-ring-128k-qkv", [fp32]).verdict == v.NOT_MEASURED
    fp16 = point(131072, {}, dtype="fp16", inputs_bytes=50_331_648, **shape)
    got = verdict_of("002-ring-128k-qkv", [fp16, fp32])
    assert (got.verdict, got.measured.value) == (v.REFUTED, 50_331_648) and "reads as fp32" in v_why(got)
    seeds = cl.load_seeds()
    assert {s: seeds[s].dtype for s in seeds} == {
        "000": "bf16",
        "001": "bf16",
        "002": "fp16",
        "003": "fp32",
        "004": "fp32",
    }
    for c in cl.load_claims():
        for m in (c.match, c.over or {}):
            # only a claim whose words name another dtype matches it (003: "fp16 would hold ...")
            assert m.get("dtype", c.dtype) == c.dtype or m["dtype"] in c.says, c.id


def v_why(verdict: v.Verdict) -> str:
    """A verdict's reason with its notes, as seeds.md shows it."""
    from attnbench.report.seeds.page import why_text

    return why_text(verdict)


def test_a_stand_in_measures_only_where_the_seeds_setting_did_not_run():
    def dp(ratio: float, gpu0: int):
        return typed_row(
            kind="speedup", case="32768x1", key=f"dp{ratio}", strategy="dp", world_size=1, impl="block-sparse",
            config={"sparsity_ratio": ratio}, dtype="fp16", heads=2, head_dim=32, seq_len=32768, mode="fwd",
            times_ms=[1.0] * 3, time_ms=1.0, gpus=[{"index": 0, "max_memory_allocated": gpu0}], env=ENV,
        )  # fmt: skip

    got = verdict_of("002-dp-32k-gpu0", [dp(0.02, 17_000_000)])  # 98% sparse stands in for 95%
    assert got.measured.value == 17_000_000 and "sparsity_ratio 0.02 stands in" in " ".join(got.measured.notes)
    got = verdict_of("002-dp-32k-gpu0", [dp(0.02, 17_000_000), dp(0.05, 20_000_000)])
    assert got.measured.value == 20_000_000 and not any("stands in" in n for n in got.measured.notes)


def test_a_claim_at_best_takes_the_best_case_but_never_an_anomaly():
    train = dict(mode="fwd_bwd", module="multihead")  # DDP's claim: training steps only
    rows = [
        speedup_row("single", [100.0] * 3, 1, batch=8, **train),
        speedup_row("mp", [20.0] * 3, 2, batch=8, **train),  # 5x on 2 GPUs: efficiency 2.5, an anomaly
        speedup_row("single", [100.0] * 3, 1, batch=8, seq_len=8192, **train),
        speedup_row("mp", [55.0] * 3, 2, batch=8, seq_len=8192, **train),
    ]
    got = verdict_of("001-distributed-efficiency", rows)
    assert got.measured.value == pytest.approx(100 / 55 / 2) and got.verdict == v.CONFIRMED


def test_the_newest_row_measures():
    rows = [
        speedup_row("single", [30.0] * 3, 1),
        speedup_row("dp", [45.0] * 3, 2, date="2026-01-01"),
        speedup_row("dp", [15.0] * 3, 2, date="2026-12-01"),
    ]
    got = verdict_of(made_up(value=2.0, direction="above:1"), rows)
    assert got.measured.value == pytest.approx(2.0) and "the newest of 2 matching cases" in got.measured.notes


def test_the_findings_are_the_seeds_headlines_furthest_refuted_one_per_seed():
    from attnbench.report.seeds.page import findings

    def fake(cid, seed, ratio, verdict=v.REFUTED, headline=True, device="cuda"):
        c = made_up(id=cid, seed=seed, value=1.0, headline=headline)
        m = Measured(ratio, None, None, "1", "GPU box", "w", "d", device=device)
        return v.Verdict(c, verdict, "", m)

    vs = [fake("a", "000", 100.0), fake("b", "000", 0.001), fake("c", "001", 3.0), fake("d", "002", 50.0)]
    vs.append(fake("e", "003", 1000.0, v.CONFIRMED))
    vs.append(fake("f", "003", 1e6, headline=False))  # furthest of all, but no seed's headline
    vs.append(fake("g", "004", 1e5, device="cpu"))  # a CPU's stand-in for the seeds' GPUs
    assert [x.claim.id for x in findings(vs)] == ["b", "d", "c"]


def test_a_claim_reads_the_rows_of_the_implementations_it_names_and_keeps_their_order():
    impls = ["sdpa", "naive", "sdpa", "dilated", "naive"]
    m = Machine("GPU box", [point(1024, {}, impl=name, series=f"s{i}") for i, name in enumerate(impls)])
    assert len(m.ran) == 5

    def series(ran):
        return [r.series for r, _ in ran]

    assert series(m.ran_of("sdpa")) == ["s0", "s2"]
    assert series(m.ran_of(["naive", "dilated"])) == ["s1", "s3", "s4"]
    assert series(m.ran_of(None)) == series(m.ran)
    assert m.ran_of("flash") == []


# --- comparable terms: fits, rings that sent nothing, CPUs for GPUs ------------------------------------

RING_CFG = {"segment_lengths": [8192], "dilation_rates": [2]}
SHARD_KV = 2 * 4096 * 8 * 64 * 4  # k and v of one rank's 4,096 tokens, H=8, D=64, fp32: 16,777,216 bytes


def timed(impl: str, world: int, ms: float, *, device: str = "cuda", sent: int | None = None, date: str = ENV["date"]):
    """004's workload in its dtype (fp32, H=8, D=64, one segment of 8K at rate 2 across the ranks)
    taking ``ms`` per call, on one device (a GPU-bound call) or as a ring over ``world`` ranks that
    sent ``sent`` bytes per call."""
    return typed_row(
        impl=impl, world_size=world, strategy="ring" if world > 1 else None, device=device, dtype="fp32",
        seq_len=8192, config=RING_CFG, series=f"{impl}x{world}", label=impl, mode="fwd", time_ms=ms,
        times_ms=[ms] * 5, sent_bytes=sent if world > 1 else None, env={**ENV, "date": date},
        dispatch_share=0.01 if world == 1 else None,
    )  # fmt: skip


def judged(cid: str, gpu: list, cpu: list) -> v.Verdict:
    machines = [Machine("GPU box", gpu)] if gpu else []
    return v.verdicts(machines + ([Machine("cpu: test CPU", cpu)] if cpu else []), [claim(cid)])[0]


def test_a_fitted_value_is_never_a_headline():
    from attnbench.report.seeds.page import findings

    # a headline capacity claim (65,536 in 8 GB) whose only rows fit 1M: predicted, not refuted
    c = made_up(value=65536, unit="tokens", metric="max_seq_8gb", match={"impl": "dilated"}, gpus=1, headline=True)
    fitted = [point(n, {}, reserved=1_000_000_000 + 2_000 * n) for n in (65536, 131072, 262144)]
    got = verdict_of(c, fitted)
    assert got.verdict == v.NOT_MEASURED and findings([got]) == []
    # the same claim against a search under 8 GiB that ran 1M, stopped by memory: a finding
    limited = search([1 << 19, 1 << 20], 1 << 21, series="l", memory_limit=8 * GIB)
    got = verdict_of(c, fitted + limited)
    assert (got.verdict, got.measured.value) == (v.REFUTED, 1 << 20) and findings([got]) == [got]


def test_a_ring_settles_a_claim_only_where_it_sent_a_tenth_of_a_shards_keys_and_values():
    # 004: the ring over 2 GPUs 2.0 ms, one GPU 1.25 ms: 1.6x against the seed's 1,600x
    single = timed("dilated", 1, 1.25)
    for sent, share in ((0, "0%"), (SHARD_KV * 95 // 1000, "9.5%")):  # nothing, or 9.5% of a shard's K/V
        got = judged("004-ring-overhead", [timed("ring-dilated", 2, 2.0, sent=sent), single], [])
        assert got.verdict == v.NOT_MEASURED and got.measured is None
        assert f"sent {share} of a shard's keys and values per call, under the 10%" in got.why
        assert "on GPU box" in got.why and "`attnbench bench --impl ring-dilated --gpus 2 --dtype fp32" in got.why
    unknown = judged("004-ring-overhead", [timed("ring-dilated", 2, 2.0), single], [])
    assert unknown.verdict == v.NOT_MEASURED and "do not record the bytes" in unknown.why
    tenth = judged("004-ring-overhead", [timed("ring-dilated", 2, 2.0, sent=SHARD_KV // 10 + 1), single], [])
    assert tenth.verdict == v.DIRECTION_ONLY and tenth.measured.value == pytest.approx(1.6)
    assert (
        tenth.measured.moved == [pytest.approx(0.1)] and "the ring sent 10% of a shard's keys and values" in tenth.why
    )
    whole = judged("004-ring-overhead", [timed("ring-dilated", 2, 2.0, sent=SHARD_KV), single], [])
    assert "the ring sent 100% of a shard's keys and values per call" in whole.why


def test_a_cpu_never_settles_a_gpu_claim():
    from attnbench.report.seeds.page import findings

    old = "2026-01-01T00:00:00+00:00"  # the GPU's rows are older than the CPU's: still they measure
    cpu = [timed("ring-dilated", 2, 1000.0, device="cpu", sent=SHARD_KV), timed("dilated", 1, 1300.0, device="cpu")]
    gpu = [timed("ring-dilated", 2, 2000.0, sent=SHARD_KV, date=old), timed("dilated", 1, 1.25, date=old)]
    got = judged("004-ring-overhead", gpu, cpu)  # 1,600x, as the seed says
    assert (got.verdict, got.measured.device, got.measured.value) == (v.CONFIRMED, "cuda", pytest.approx(1600))
    # a GPU pair whose ring sent nothing leaves the claim unsettled; the CPU's rows do not step in
    idle_gpu = [timed("ring-dilated", 2, 2000.0, sent=0, date=old), timed("dilated", 1, 1.25, date=old)]
    got = judged("004-ring-overhead", idle_gpu, cpu)
    assert got.verdict == v.NOT_MEASURED and "on GPU box sent 0%" in got.why
    # with no GPU rows two CPU processes never stand in for two GPUs
    got = judged("004-ring-overhead", [], cpu)
    assert got.verdict == v.NOT_MEASURED and got.measured is None and findings([got]) == []


RING_VARIANT_TABLE = [f"002-ring-{n}k-qkv" for n in (16, 32, 64, 128)] + [f"002-ring-{n}k-peak" for n in (16, 32, 64)]


# Claims judged in their seed's one dtype that the seeds-8gib profile runs in another (fp32): its owner
# adds them (bf16 for seed 001, fp16 for seed 002); until then each names the command that measures it.
NOT_IN_SEEDS_8GIB = {
    "001-alloc-32k",
    "001-alloc-65k",
    "001-standard-attention-oom",
    *(c for c in RING_VARIANT_TABLE if c != "002-ring-128k-qkv"),  # its fp16 98% search holds q, k, v at 128K
    "002-ring-memory-per-token",
    "002-ring-vs-dense-memory",
    "002-base-vs-ring-max",
}


def test_the_seeds_8gib_profile_measures_the_claims_it_is_named_for():
    """Rows as the seeds-8gib profile's series write them settle every one-GPU claim about a GPU's
    memory (searched under 8 GiB, never fitted; a projection onto a larger GPU from below) and 002's
    ring-variant table, in each seed's dtype: the verdicts read row fields, not the directory the
    rows sit in."""
    from attnbench.plan import build_plan

    rows = []
    for i, s in enumerate(build_plan("seeds-8gib", [], {}, {}, "seeds-8gib").series):
        st = s.settings
        shape = dict(impl=s.impl, heads=st.heads, head_dim=st.head_dim, dtype=st.dtype, memory_limit=st.memory_limit)
        sizes = dict(inputs_bytes=1_000_000, peak_bytes=2_000_000, **shape)
        if st.kind == "max-seq":
            rows += search(
                [st.search.start, 2 * st.search.start], 4 * st.search.start, series=f"s{i}", cfg=s.config, **sizes
            )
        else:
            rows += [point(n, s.config, series=f"s{i}", **sizes) for n in st.points.seq_lens]
    capacity = [c.id for c in cl.load_claims() if c.comparable and c.metric == "max_seq_8gb" and c.where == "one GPU"]
    assert len(capacity) == 15
    table = [*RING_VARIANT_TABLE, "002-ring-memory-per-token", "002-ring-vs-dense-memory", "002-base-vs-ring-max"]
    for cid in capacity + table:
        got = verdict_of(cid, rows)
        if cid in NOT_IN_SEEDS_8GIB:
            assert got.verdict == v.NOT_MEASURED and "`attnbench " in got.why, cid
            continue
        assert got.verdict != v.NOT_MEASURED and got.measured is not None, (cid, got.why)
        if cid in capacity:
            assert got.measured.limit == 8 * GIB and not got.measured.fitted, cid


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
    from attnbench.report.sections.data_parallel import speedup_notes
    from attnbench.report.tables.multigpu import speedup_cases

    # 100 ms over 20 ms on 2 GPUs: 5x, efficiency 2.5; 50 ms over [40, 50, 60]: the interval crosses 1
    rows = [
        speedup_row("single", [100.0] * 3, 1, batch=8),
        speedup_row("mp", [20.0] * 3, 2, batch=8),
        speedup_row("single", [50.0] * 3, 1, batch=8, seq_len=8192),
        speedup_row("mp", [40.0, 50.0, 60.0], 2, batch=8, seq_len=8192),
    ]
    notes = {c.row.seq_len: speedup_notes(c) for c in speedup_cases(rows)}
    assert notes[16384] == "anomaly: efficiency 2.50 above 1"
    assert notes[8192] == "anomaly: interval includes 1"


def test_every_claims_field_is_documented_in_the_claims_file():
    text = cl.CLAIMS_FILE.read_text()
    for f in dataclasses.fields(cl.Claim):
        assert f"#   {f.name} " in text, f.name
    assert SCHEMA_VERSION  # rows of this schema are what the claims match


@pytest.mark.gpu
def test_batch_one_data_parallel_on_one_gpu_holds_what_one_gpu_holds(tmp_path):
    """The seeds' batch-1 DataParallel claims are measured on one GPU: with one batch element
    DataParallel runs one replica, on GPU 0. Over one GPU it must hold what the single-GPU run
    of the same case holds, and give the same output."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from conftest import run_cli

    params = ("pattern_type=dilated_sparse", "sparsity_ratio=0.05", "block_size=256")
    done = run_cli(
        "speedup",
        "--impl",
        "block-sparse",
        *(x for p in params for x in ("--param", p)),
        *("--device", "cuda", "--dtype", "fp16", "--heads", "2", "--head-dim", "32"),
        *("--gpus", "1", "--strategy", "dp", "--cases", "32768x1", "--out", tmp_path / "run"),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (tmp_path / "run" / "trials.jsonl").read_text().splitlines()
    rows = {r["strategy"]: r for r in map(json.loads, lines) if r["kind"] == "speedup"}
    single, dp = rows["single"], rows["dp"]
    assert dp["status"] == "ok" and dp["output_match"] is True and dp["replica_batches"] == [[0, 1]]
    held = [r["gpus"][0]["max_memory_allocated"] for r in (single, dp)]
    assert abs(held[1] - held[0]) <= 0.05 * held[0], held


@pytest.mark.parametrize("value,text", [(22.4, "22.4x"), (0.248, "0.248x"), (1025.5, "1,026x"), (45000.0, "45,000x")])
def test_ratios_read_as_plain_numbers(value, text):
    """A thousandfold ratio reads 1,026x, never 1.03e+03x."""
    assert cl.value_text("peak_ratio", value) == text
