"""The verdict rule's terms (docs/design/verdicts.md, "Comparable terms"), one test per rule: a ring
that moved a real share of its keys and values, one dtype per seed, a speed ratio's size only where
compute dominates, the right kind of row, projections measured under an allocator limit, memory of
an unstated shape read over the floor, and the verdicts that changed since the previous rule. Every
expected value is worked out by hand in the test."""

from __future__ import annotations

import pytest
from test_report_claims import ENV, made_up, point, search, speedup_row, verdict_of

from attnbench.report.fit import GIB
from attnbench.report.seeds import claims as cl
from attnbench.report.seeds import page
from attnbench.report.seeds import verdicts as v
from attnbench.report.seeds.measured import kv_share

from conftest import typed_row

# --- a ring settles a claim only where it moved a real share of its keys and values -------------------


def ring_row(world: int, sent: int, *, kv_heads: int | None = None) -> object:
    return typed_row(
        impl="ring", world_size=world, strategy="ring", dtype="bf16", heads=8, head_dim=64, kv_heads=kv_heads,
        seq_len=65536, series="r", label="r", mode="fwd", time_ms=1.0, times_ms=[1.0] * 3, sent_bytes=sent, env=ENV,
    )  # fmt: skip


def test_a_rings_share_is_its_bytes_sent_over_one_shards_keys_and_values():
    # 65,536 tokens over 4 ranks: a shard of 16,384 tokens, k and v of H=8, D=64 in bf16:
    # 2 x 16,384 x 8 x 64 x 2 = 33,554,432 bytes; a dense ring passes each on 3 times
    assert kv_share(ring_row(4, 3 * 33_554_432)) == pytest.approx(3.0)
    # grouped-query heads: 2 key/value heads make the shard's K/V a quarter (8,388,608 bytes)
    assert kv_share(ring_row(4, 8_388_608, kv_heads=2)) == pytest.approx(1.0)
    # block-sparse-ring at 0.01% of blocks: 3,355 bytes of 33,554,432 is 0.01%
    assert kv_share(ring_row(4, 3_355)) == pytest.approx(1e-4, rel=1e-3)
    assert kv_share(ring_row(4, None)) is None


# --- one dtype per seed ---------------------------------------------------------------------------------


def test_a_claim_matching_another_dtype_than_its_seeds_is_refused_unless_its_words_name_it(tmp_path):
    seed = '[[seed]]\nid = "003"\ndtype = "fp32"\nwhy = "stated"\nshape_stated = false\n'
    claim = (
        '[[claim]]\nid = "x"\nseed = "003"\nvalue = 1\nunit = "x"\nworkload = "w"\ngpus = 1\nmetric = "max_seq_8gb"\n'
    )
    path = tmp_path / "claims.toml"
    path.write_text(seed + claim + 'says = "longest"\nmatch = { impl = "dilated", dtype = "fp16" }\n')
    with pytest.raises(cl.AttnbenchError, match="matches fp16 where seed 003 is judged in fp32"):
        cl.load_claims(path)
    path.write_text(seed + claim + 'says = "fp16 would hold more"\nmatch = { impl = "dilated", dtype = "fp16" }\n')
    assert cl.load_claims(path)[0].match["dtype"] == "fp16"
    path.write_text(seed + claim + 'says = "longest"\nmatch = { impl = "dilated" }\nover = { impl = "naive" }\n')
    got = cl.load_claims(path)[0]  # the seed's dtype is in every matcher
    assert (got.dtype, got.match["dtype"], got.over["dtype"], got.shape_stated) == ("fp32", "fp32", "fp32", False)
    path.write_text(seed + claim + 'says = "s"\ndtype = "fp16"\nmatch = { impl = "dilated" }\n')
    with pytest.raises(cl.AttnbenchError, match="set them in its \\[\\[seed\\]\\] entry"):
        cl.load_claims(path)


def test_seeds_md_states_each_seeds_dtype_once():
    text = page.seeds_markdown(v.verdicts([]), cl.Previous("v0", {}), cl.load_seeds())
    assert "Every claim judged in fp16: the seed's code asks for float16" in text
    for dtype in ("bf16", "fp16", "fp32"):
        assert text.count(f"Every claim judged in {dtype}:") == {"bf16": 2, "fp16": 1, "fp32": 2}[dtype]


# --- a speed ratio's size only where compute dominates ------------------------------------------------


def dp_case(host: float | None, dp_ms: float = 620.0, **fields) -> list:
    """One GPU 100 ms, DataParallel on two ``dp_ms`` (a speedup of 100 / 620 = 0.161x); the one-GPU
    call spends ``host`` of its eager time on the host."""
    return [
        speedup_row("single", [99.0, 100.0, 101.0], 1, host=host, **fields),
        speedup_row("dp", [dp_ms - 20, dp_ms, dp_ms + 20], 2, **fields),
    ]


def test_a_speedups_size_is_judged_only_where_the_one_gpu_call_is_compute_bound():
    slower = made_up(value=0.16, direction="below:1")
    far = dp_case(0.05, dp_ms=6200.0)  # 5% on the host: its 0.016x is judged, a tenth of the seed's 0.16x
    assert verdict_of(slower, far).verdict == v.DIRECTION_ONLY
    got = verdict_of(slower, dp_case(0.81, dp_ms=6200.0))  # 81% on the host: its side alone
    assert got.verdict == v.DIRECTION_HOLDS and "its size is not judged: the host takes 10% or more" in got.why
    assert "the one-GPU call spends 81% of its eager time on the host" in got.why
    unknown = verdict_of(slower, dp_case(None, dp_ms=6200.0))
    assert unknown.verdict == v.DIRECTION_HOLDS and "host share is not recorded" in unknown.why
    # the side is still judged: a benefit where it ran slower is refuted
    assert verdict_of(made_up(value=1.29, direction="above:1"), dp_case(0.81)).verdict == v.REFUTED
    # a size with no side to judge has nothing left: no compute-bound case measured it
    sized = made_up(value=0.5)
    got = verdict_of(sized, dp_case(0.81))
    assert got.verdict == v.NOT_MEASURED and got.why.startswith("no compute-bound case")


def test_at_best_takes_the_best_compute_bound_case():
    # 2K x 8: 1.9x on two GPUs (efficiency 0.95) but its one-GPU call is host-bound; 128K x 8: 1.5x
    # (0.75), compute-bound: the seed's "70-80% at best" is held against 0.75
    rows = [
        speedup_row("single", [95.0, 100.0, 105.0], 1, batch=8, seq_len=2048, host=0.6),
        speedup_row("dp", [50.0, 52.6, 55.0], 2, batch=8, seq_len=2048),
        speedup_row("single", [148.0, 150.0, 152.0], 1, batch=8, seq_len=131072, host=0.01),
        speedup_row("dp", [99.0, 100.0, 101.0], 2, batch=8, seq_len=131072),
    ]
    got = verdict_of("001-dp-efficiency", rows)
    assert got.measured.value == pytest.approx(0.75) and got.verdict == v.CONFIRMED


# --- the right kind of row -----------------------------------------------------------------------------


def test_a_ddp_claim_is_held_against_training_steps_of_the_multi_head_module():
    train = dict(mode="fwd_bwd", module="multihead")
    forward = [speedup_row("single", [100.0] * 3, 1, batch=8), speedup_row("mp", [50.0] * 3, 2, batch=8)]  # 100%
    training = [
        speedup_row("single", [100.0] * 3, 1, batch=8, seq_len=131072, **train),
        speedup_row("mp", [52.0] * 3, 2, batch=8, seq_len=131072, **train),  # 100 / 52 / 2 = 96.2%
    ]
    assert verdict_of("001-distributed-efficiency", forward).verdict == v.NOT_MEASURED
    got = verdict_of("001-distributed-efficiency", forward + training)
    assert got.verdict == v.CONFIRMED and got.measured.value == pytest.approx(100 / 52 / 2)
    # and a forward claim never rests on a training step
    assert verdict_of(made_up(value=0.16, match={"strategy": "mp"}), training).verdict == v.NOT_MEASURED


def test_an_anomaly_the_speedup_tables_flag_never_settles_a_claim():
    # 100 ms over 45 ms on 2 GPUs: 2.22x, efficiency 1.11 above 1: the tables' anomaly
    train = dict(mode="fwd_bwd", module="multihead")
    odd = [speedup_row("single", [100.0] * 3, 1, batch=8, **train), speedup_row("mp", [45.0] * 3, 2, batch=8, **train)]
    got = verdict_of("001-distributed-efficiency", odd)
    assert got.verdict == v.INCONCLUSIVE and "(anomaly: efficiency 1.11 above 1)" in got.why


def test_data_parallel_memory_is_held_against_cases_with_the_replicas_the_seed_showed():
    # 000: GPU 0 144.2 MB, GPU 1 8.1 MB: GPU 1 held something, so two replicas ran
    def dp(batch: int, gpu0: int, gpu1: int, replicas: list):
        return typed_row(
            kind="speedup", case=f"8192x{batch}", key=f"dp{batch}", strategy="dp", world_size=2, impl="block-sparse",
            seq_len=8192, batch=batch, mode="fwd", times_ms=[1.0] * 3, time_ms=1.0, replica_batches=replicas,
            gpus=[{"index": 0, "max_memory_allocated": gpu0}, {"index": 1, "max_memory_allocated": gpu1}], env=ENV,
        )  # fmt: skip

    one = dp(2, 150_000_000, 0, [[0, 2]])  # a case where one replica took the whole batch
    assert verdict_of("000-dp-gpu0-memory", [one]).verdict == v.NOT_MEASURED
    two = dp(2, 140_000_000, 33_554_432, [[0, 1], [1, 1]])
    got = verdict_of("000-dp-gpu0-memory", [one, two])
    assert got.verdict == v.CONFIRMED and got.measured.value == 140_000_000


# --- projections measured under an allocator limit; a lower bound held as one ----------------------------

RING_VARIANT = dict(impl="block-sparse", dtype="fp16", heads=2, head_dim=32)


def test_a_projection_onto_a_larger_gpu_is_searched_under_its_memory():
    # "RTX 3090 (24 GB): about 196K tokens": a search under 24 GiB that memory stopped at 196,608
    cfg = {"sparsity_ratio": 0.05, "block_size": 256}
    exact = search([131072, 196608], 262144, series="e", cfg=cfg, memory_limit=24 * GIB, **RING_VARIANT)
    got = verdict_of("002-rtx3090-projection", exact)
    assert (got.verdict, got.measured.value, got.measured.bound) == (v.CONFIRMED, 196608, False)
    assert "longest sequence in 24 GB: one GTX 1080 (8 GB), projected to an RTX 3090 (24 GB)" in got.why
    # where only 8 GiB was searched, what fits there fits in 24 GiB: 1M at its cap is at least 5.3x
    capped = search([131072, 1 << 20], None, series="c", cfg=cfg, memory_limit=8 * GIB, **RING_VARIANT)
    got = verdict_of("002-rtx3090-projection", capped)
    assert got.verdict == v.REFUTED and got.measured.bound and "at least 5.3x the seed's value" in got.why
    assert "what fits in 8 GiB fits in 24 GiB: a lower bound" in page.why_text(got)
    # 8 GiB that memory stopped at 131,072: at least 131,072, which does not settle about 196K
    small = search([65536, 131072], 196608, series="s", cfg=cfg, memory_limit=8 * GIB, **RING_VARIANT)
    assert verdict_of("002-rtx3090-projection", small).verdict == v.INCONCLUSIVE


def test_a_lower_bound_the_seed_claimed_is_held_as_one():
    # "DataParallel could reach 262K with the base": one GPU under 8 GiB ran 1M at its cap
    base = dict(impl="block-sparse", dtype="fp16", memory_limit=8 * GIB)
    got = verdict_of("002-dp-max-base", search([131072, 1 << 20], None, cfg={"sparsity_ratio": 0.01}, **base))
    assert got.verdict == v.CONFIRMED and got.why.startswith("above 262,144 (256K): at least 1,048,576 (1M)")
    # "multi-million tokens": the heavier H=8, D=64 bf16 ring stands in from below; 1.8M settles nothing
    ring = dict(impl="ring", world_size=2, dtype="bf16", memory_limit=8 * GIB, sent_bytes=1 << 40)  # K/V moved
    got = verdict_of("002-ring-multi-million", search([1 << 20, 1835008], 1900544, **ring))
    assert got.verdict == v.INCONCLUSIVE and got.measured.bound
    assert "at least 1,835,008 (1.8M), a lower bound that does not settle" in got.why
    assert "--heads 2 --head-dim 32" in got.why  # what would settle it: the seed's own shape
    assert verdict_of("002-ring-multi-million", search([1 << 20, 2 << 20], 3 << 20, **ring)).verdict == v.CONFIRMED


# --- memory of a seed that states no shape, over the floor ------------------------------------------------

FLOOR_003 = 4 * 237568 * 8 * 64 * 4  # q, k, v and the output at 237,568 tokens, H=8, D=64, fp32: 1,946,157,056


def test_an_unstated_shape_that_spans_the_gap_leaves_memory_inconclusive():
    cfg = {"segment_lengths": [4096], "dilation_rates": [1]}
    at = dict(impl="dilated", floor_bytes=FLOOR_003)
    # 2.43 GB against the seed's 4.53: 1/1.86 at H=8, D=64; over the floor 1.25x against 2.33x, and
    # twice the width puts the seed's at 1.16x: within the tolerance
    got = verdict_of("003-memory-no-dilation", [point(237568, cfg, peak_bytes=2_430_000_000, **at)])
    assert got.verdict == v.INCONCLUSIVE and "the unknown shape spans the gap" in got.why
    assert "the measured is 1.25x, the seed's 2.33x, and 1.16x to 4.66x" in got.why
    # 0.9 GB: even at twice the width the seed's 4.525-4.535 GB is 2.5x what a factor of 1.25 allows
    got = verdict_of("003-memory-no-dilation", [point(237568, cfg, peak_bytes=900_000_000, **at)])
    assert got.verdict == v.REFUTED and "no such shape closes the gap" in got.why
    # a seed that states its shape gets no such span: 002's base output, 64.1 MB, against 30 MB
    shape = dict(dtype="fp16", impl="sdpa", inputs_bytes=201_326_592, peak_bytes=231_326_592)
    got = verdict_of("002-base-64k-dense-memory", [point(65536, {}, **shape)])
    assert got.verdict == v.REFUTED and "floor" not in got.why


# --- the verdicts the rule changed --------------------------------------------------------------------------


def test_the_seeds_page_names_the_verdicts_that_changed_since_the_previous_rule():
    a = v.Verdict(made_up(id="a"), v.CONFIRMED, "", None)
    b = v.Verdict(made_up(id="b"), v.NOT_MEASURED, "", None)
    c = v.Verdict(made_up(id="c"), v.REFUTED, "", None)  # new since: no previous verdict
    previous = cl.Previous("v2, on old rows", {"a": v.CONFIRMED, "b": v.REFUTED})
    assert page.changed([a, b, c], previous) == [(b, v.REFUTED)]
    text = page.changed_text([a, b, c], previous)
    assert text.startswith("1 of 3 verdicts differ from those of the previous rule (v2, on old rows):")
    assert "- b: refuted -> **not measured yet**" in text
    assert page.changed_text([a, b, c], None) == ""
    recorded = cl.load_previous()
    assert recorded is not None and set(recorded.verdict) == {x.id for x in cl.load_claims()}
    assert set(recorded.verdict.values()) <= set(v.VERDICTS)


# --- what would measure a claim no row does -------------------------------------------------------------


def suggested_commands() -> list[str]:
    """Every command a claim names for the rows it lacks (between backticks in ``rows_from``)."""
    return sorted(
        {cmd for c in cl.load_claims() for cmd in c.rows_from.split("`")[1::2] if cmd.startswith("attnbench")}
    )


def test_claims_suggest_commands():
    assert len(suggested_commands()) >= 10


@pytest.mark.parametrize("command", suggested_commands())
def test_every_command_a_claim_suggests_parses(command):
    """A reader copies these: each names a real command and real options."""
    import shlex

    import typer

    from attnbench.cli import app

    words = shlex.split(command)
    typer.main.get_command(app).commands[words[1]].make_context(words[1], words[2:])
