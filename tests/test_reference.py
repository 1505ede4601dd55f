"""Every implementation against the float64 masked reference, and the reference and the
declared key sets against independent transcriptions of docs/design/semantics.md."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from attnbench import impls
from attnbench.impls.dilated import head_groups
from attnbench.results.schema import Environment
from attnbench.trials.reference import TOLERANCE, VerifyCase, default_cases, masked_reference, relative_error, run_case

CASES = [c for name in ["naive", "sdpa", "dilated"] for c in default_cases(name, "cpu", ["fp32", "bf16"])]


@pytest.mark.parametrize(
    "case",
    CASES,
    ids=lambda c: (
        f"{c.impl}-{c.config}-B{c.batch}-N{c.seq_len}-H{c.heads}-{'causal' if c.causal else 'full'}-{c.dtype}"
    ),
)
def test_impl_matches_reference(case):
    row = run_case(case)
    assert row.status == "pass", row
    assert row.rel_err <= TOLERANCE[case.dtype]


def test_cases_cover_batches_causal_and_uneven_groups():
    dilated = [c for c in CASES if c.impl == "dilated"]
    assert any(c.batch > 1 for c in dilated)
    assert {c.causal for c in dilated} == {True, False}
    # 5 heads over 2 or 3 groups and 3 heads over 2 groups do not divide evenly
    assert any(c.heads % len(c.config["segment_lengths"]) for c in dilated)


def dilated_mask_by_definition(seq_len, num_heads, ws, rs):
    """docs/design/semantics.md, literally: group i has floor(H/G) + (1 if i < H mod G) heads, offset i mod r_i."""
    G = len(ws)
    mask = torch.zeros(num_heads, seq_len, seq_len, dtype=torch.bool)
    h = 0
    for i in range(G):
        w, r, o = ws[i], rs[i], i % rs[i]
        for _ in range(num_heads // G + (1 if i < num_heads % G else 0)):
            for t in range(seq_len):
                m, p = divmod(t, w)
                if p % r != o:
                    continue
                for pp in range(w):
                    if pp % r == o:
                        mask[h, t, m * w + pp] = True
            h += 1
    return mask


@pytest.mark.parametrize(
    "ws,rs,heads", [([8], [1], 3), ([8, 16], [1, 2], 5), ([4, 8, 16], [1, 2, 4], 7), ([16, 16], [4, 2], 4)]
)
def test_dilated_key_sets_follow_the_definition(ws, rs, heads):
    impl = impls.build("dilated", segment_lengths=ws, dilation_rates=rs)
    n = 2 * impl.granularity
    assert torch.equal(impl.key_mask(n, heads), dilated_mask_by_definition(n, heads, ws, rs))


def test_head_group_sizes():
    assert [g.heads.stop - g.heads.start for g in head_groups(5, [1, 2], [1, 1])] == [3, 2]
    assert [g.heads.stop - g.heads.start for g in head_groups(5, [1, 2, 4], [1, 1, 1])] == [2, 2, 1]
    assert [g.offset for g in head_groups(6, [8, 8, 8], [1, 2, 4])] == [0, 1, 2]


@pytest.mark.parametrize(
    "name,config",
    [
        ("naive", {}),
        ("sdpa", {}),
        ("dilated", {"segment_lengths": [8, 16], "dilation_rates": [1, 2]}),
        ("dilated", {"segment_lengths": [4, 8, 16], "dilation_rates": [1, 2, 4]}),
    ],
)
@pytest.mark.parametrize("causal", [False, True])
def test_closed_form_pair_count_equals_the_mask(name, config, causal):
    impl = impls.build(name, **config)
    n = max(impl.granularity, 16) * 2 if name == "dilated" else 128
    for heads in (3, 5):
        assert impl.useful_pairs(n, heads, causal) == int(impl.key_mask(n, heads, causal=causal).sum())


def test_reference_equals_independent_dense_attention():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 33, 3, 8, dtype=torch.float64) for _ in range(3))
    for causal in (False, True):
        mask = torch.ones(3, 33, 33, dtype=torch.bool)
        if causal:
            mask = mask.tril()
        expected = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=causal).transpose(
            1, 2
        )
        assert relative_error(masked_reference(q, k, v, mask), expected) < 1e-12


@pytest.mark.parametrize("chunk_rows", [33, 7, 1])
def test_reference_in_blocks_of_query_rows_is_the_same_attention(monkeypatch, chunk_rows):
    """However few query rows a chunk holds (a long check's reference is computed a block of
    rows at a time), the reference is sdpa's dense attention, with its empty rows zero."""
    from attnbench.trials import reference

    torch.manual_seed(1)
    q, k, v = (torch.randn(2, 33, 3, 8, dtype=torch.float64) for _ in range(3))
    monkeypatch.setattr(reference, "REFERENCE_CHUNK_BYTES", 3 * 8 * 2 * 33 * chunk_rows)
    mask = torch.ones(3, 33, 33, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True).transpose(1, 2)
    assert relative_error(masked_reference(q, k, v, mask), expected) < 1e-12
    mask[1, 5] = False  # head 1's query 5 sees no key
    out = masked_reference(q, k, v, mask)
    assert torch.all(out[:, 5, 1] == 0) and relative_error(out[:, 6:], expected[:, 6:]) < 1e-12


def test_reference_gives_zero_rows_for_empty_key_sets():
    q, k, v = (torch.randn(1, 4, 1, 2, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([[[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 1]]], dtype=torch.bool)
    out = masked_reference(q, k, v, mask)
    assert torch.all(out[0, 1] == 0)
    scores = (q[0, 0, 0] @ k[0, :2, 0].T) / math.sqrt(2)
    assert torch.allclose(out[0, 0, 0], torch.softmax(scores, 0) @ v[0, :2, 0])


def test_a_wrong_implementation_fails_verification(monkeypatch):
    """The check can fail: drop the dilation (attend to the whole segment) and it must."""
    from attnbench.impls.dilated import DilatedAttention
    from attnbench.trials.reference import VerifyCase

    real = DilatedAttention._key_sets
    monkeypatch.setattr(
        DilatedAttention, "_key_sets", lambda self, n, h: real(self, n, h) | torch.eye(n, dtype=torch.bool)
    )
    case = VerifyCase(
        "dilated",
        {"segment_lengths": [16, 32], "dilation_rates": [1, 2], "max_chunk_tokens": 1 << 19},
        1,
        32,
        2,
        8,
        False,
        "fp32",
        "cpu",
    )
    assert run_case(case).status == "fail"


@pytest.mark.parametrize("backend", ["math", "flash"])
def test_dilated_runs_the_named_sdpa_backend_and_records_it(backend):
    impl = impls.build("dilated", segment_lengths=[16, 32], dilation_rates=[1, 2], backend=backend)
    assert impl.config()["backend"] == backend
    row = run_case(VerifyCase("dilated", impl.config(), 2, 64, 3, 16, False, "fp32", "cpu"))
    assert row.status == "pass", row
    assert row.backend == f"sdpa:{backend}"


def test_dilated_at_the_default_backend_keeps_its_recorded_configuration():
    # rows written before the backend option existed keep their series identity
    assert "backend" not in impls.build("dilated").config()


# --- a configuration too long for the float64 reference: its reduced twin ----------------------


def _check_plan(impl: str, seg: list[int], rates: list[int], n: str, gpus: int | None = None):
    from attnbench.plan import build_plan
    from attnbench.sweeps.runner import resolve, verify_cases

    flags = {"kind": "points", "seq_lens": n, "device": "cpu", "dtype": "fp32", "heads": 4, "head_dim": 16}
    if gpus:
        flags["gpus"] = str(gpus)
    params = {"segment_lengths": ",".join(map(str, seg)), "dilation_rates": ",".join(map(str, rates))}
    plan = resolve(build_plan("t", [impl], flags, params))
    return plan, verify_cases(plan)[0]


def test_a_check_whose_reference_cannot_fit_runs_on_its_reduced_twin():
    """dilated with segments of 512K and 1M tokens is checked at its own smallest length, 1M:
    a float64 reference of 3 x (1M)^2 x H x 8 bytes (96 TiB at H=4). Its twin divides the
    sequence and every segment by one power of two, so the relation of segment to sequence
    holds, and the row names the configuration it stands for."""
    from attnbench.trials.reference import REFERENCE_BUDGET_BYTES, reference_bytes

    _, (case,) = _check_plan("dilated", [524288, 1048576], [4, 8], "1M")
    assert case.twin_of["segment_lengths"] == [524288, 1048576] and case.twin_scale > 1
    f = case.twin_scale
    assert case.seq_len * f == 1 << 20 and case.config["segment_lengths"] == [524288 // f, 1048576 // f]
    assert case.config["dilation_rates"] == [4, 8] and reference_bytes(case) <= REFERENCE_BUDGET_BYTES
    row = case.row(run_case(case), "out", None)
    assert row.status == "pass", row
    assert row.twin_of["segment_lengths"] == [524288, 1048576] and row.twin_scale == f
    assert row.seq_len == case.seq_len and row.elapsed_s >= 0


def test_a_small_check_is_not_reduced():
    _, (case, *_long) = _check_plan("dilated", [64, 128], [1, 2], "1K")
    assert case.twin_of is None and case.twin_scale == 1 and case.seq_len == 128


@pytest.mark.parametrize(
    ("impl", "seg", "rates"),
    [("ring-dilated", [524288, 1048576], [4, 8]), ("ring-dilated-hilbert", [8192], [2])],
)
def test_a_ring_twin_keeps_segments_longer_than_a_shard(impl, seg, rates):
    """On two ranks a segment as long as the sequence crosses ranks; in the twin it still does
    (a Hilbert order's twin divides by a power of 4, so its automatic grid keeps its shape)."""
    _, cases = _check_plan(impl, seg, rates, str(seg[-1]), gpus=2)
    (case,) = [c for c in cases if c.world_size == 2]
    shard = case.seq_len // 2
    assert case.twin_scale > 1 and max(case.config["segment_lengths"]) > shard
    if impl == "ring-dilated-hilbert":
        assert case.twin_scale.bit_length() % 2 == 1  # 4, 16, 64, ...


@pytest.mark.distributed
def test_a_ring_twin_is_checked_across_two_ranks():
    from attnbench.sweeps import seqpar

    _, cases = _check_plan("ring-dilated", [524288, 1048576], [4, 8], "1M", gpus=2)
    (case,) = [c for c in cases if c.world_size == 2]
    ((_, row),) = seqpar.verify([case])
    assert row.status == "pass", row
    assert row.twin_of["segment_lengths"] == [524288, 1048576] and row.twin_scale == case.twin_scale


def test_a_failed_twin_fails_the_series_it_stands_for(tmp_path, monkeypatch):
    """The runner maps a twin's check row to the series of the configuration it stands for."""
    from attnbench.sweeps import runner as sweep_runner

    plan, (case,) = _check_plan("dilated", [524288, 1048576], [4, 8], "1M")
    checked = replace(run_case(case), status="fail", message="injected")
    failing = case.row(checked, "out", Environment(machine="cpu: test"))
    monkeypatch.setattr(sweep_runner.SweepRunner, "run_checks", lambda self, cases, *args, **kw: [failing])
    r = sweep_runner.SweepRunner(plan, tmp_path / "out", Environment(machine="cpu: test"))
    (outcome,) = r.run()
    assert outcome.verified is False
