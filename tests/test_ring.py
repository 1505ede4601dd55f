"""Sequence-parallel attention on CPU ranks (gloo under torchrun, 2 and 4 processes): each
ring implementation gathered across ranks equals the float64 reference and its
single-device counterpart, causal and not; a failing rank ends the run with its error; an
OOM on one rank is the trial's status; bad input is one line, exit 2, nothing written.

Launching torchrun costs seconds, so each launch carries many cases."""

import math

import pytest
import torch

from attnbench import impls
from attnbench.errors import ConfigError
from attnbench.impls.sequence_parallel.engine import (
    LseAccumulator,
    RingSchedule,
    Selection,
    attend_with_lse,
    kept_slice,
    plan_transfers,
)
from attnbench.impls.sequence_parallel.layouts import contiguous_positions, zigzag_positions
from attnbench.impls.sequence_parallel.merge import _merge_eager, merge_into
from attnbench.masks import PATTERN_TYPES
from attnbench.results import read_rows
from attnbench.sweeps import seqpar
from attnbench.trials.reference import TOLERANCE, default_cases, masked_reference, relative_error
from attnbench.trials.trial import TrialSpec
from attnbench.trials.workload import Workload
from attnbench.units import parse_gpus

from conftest import main_in_process, not_timed_out, run_cli
from distributed_selftest import Plans, ring_exchanges

RING_IMPLS = ["ring", "ring-dilated", "ring-dilated-hilbert", "block-sparse-ring"]

# ---------------------------------------------------------------------------------------
# Pieces, in one process
# ---------------------------------------------------------------------------------------


def test_block_log_sum_exp_is_the_softmax_denominator():
    q, k, v = (torch.randn(2, 3, 9, 16, dtype=torch.float64) for _ in range(3))
    out, lse, _ = attend_with_lse(q.float(), k.float(), v.float(), causal=False)
    scores = q @ k.transpose(-1, -2) / math.sqrt(16)
    assert torch.allclose(lse.double(), torch.logsumexp(scores, -1), atol=1e-5)
    assert torch.allclose(out.double(), torch.softmax(scores, -1) @ v, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merging_blocks_equals_one_softmax_over_all_keys(dtype):
    """Keys split into uneven blocks, some query rows seeing no key of a block (causal
    block of a later chunk merged only into part of the rows)."""
    q, k, v = (torch.randn(1, 2, 12, 8, dtype=torch.float64) for _ in range(3))
    acc = LseAccumulator((1, 2, 12, 8), "cpu", dtype)
    for part in (slice(0, 5), slice(5, 6), slice(6, 12)):
        out, lse, _ = attend_with_lse(q.to(dtype), k[:, :, part].to(dtype), v[:, :, part].to(dtype), False)
        acc.add(out, lse)
    mask = torch.ones(2, 12, 12, dtype=torch.bool)
    ref = masked_reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask)
    assert relative_error(acc.result().transpose(1, 2), ref) < TOLERANCE["bf16" if dtype == torch.bfloat16 else "fp32"]


def test_rows_no_block_reached_stay_zero():
    acc = LseAccumulator((1, 1, 4, 2), "cpu", torch.float32)
    out, lse, _ = attend_with_lse(*(torch.randn(1, 1, 2, 2) for _ in range(3)), causal=False)
    acc.add(out, lse, rows=slice(2, 4))
    result = acc.result()
    assert torch.equal(result[:, :, :2], torch.zeros(1, 1, 2, 2)) and torch.isfinite(result).all()
    assert torch.allclose(result[:, :, 2:], out)


class _Uneven(RingSchedule):
    """Rank r sends r+1 tokens (kept every other one) to each later rank and 3 to each earlier."""

    def __init__(self, piece: int | None, gather: bool = False) -> None:
        self.piece, self.gather = piece, gather

    def piece_tokens(self):
        return self.piece

    def gathers(self):
        return self.gather

    def select(self, receiver, sender):
        tokens, count = kept_slice(1, 2 * (sender + 1), 2) if receiver > sender else kept_slice(0, 3)
        return [Selection(tokens, slice(None), count)]


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("piece, gather", [(None, False), (1, False), (2, False), (2, True)])
def test_exchanges_line_up_across_ranks_and_carry_every_token_once(world, piece, gather):
    """What rank r sends to d in its i-th exchange is what d receives from r in its i-th
    (so NCCL's pairs match), and the pieces of a pair are its selection, in order. A gathering
    schedule makes one exchange with every peer, its selections whole."""
    exchanges = [plan_transfers(_Uneven(piece, gather), r, world) for r in range(world)]
    assert len({len(e) for e in exchanges}) == 1
    if gather:
        assert all(len(e) == 1 and len(e[0]) == world - 1 for e in exchanges)
        piece = None
    for r in range(world):
        for i, exchange in enumerate(exchanges[r]):
            for t in exchange:
                peer = next(p for p in exchanges[t.dst][i] if p.src == r)
                assert [(s.tokens, s.count) for s in t.send] == [(s.tokens, s.count) for s in peer.recv]
                assert all(s.count <= (piece or s.count) for s in t.send)
    for r in range(world):
        for d in range(world):
            if d == r:
                continue
            sent = [s for e in exchanges[r] for t in e if t.dst == d for s in t.send]
            x = torch.arange(20).view(1, 20, 1, 1)
            whole = _Uneven(None).select(d, r)[0].take(x).flatten().tolist()
            assert [i for s in sent for i in s.take(x).flatten().tolist()] == whole


def test_the_merge_kernel_and_its_eager_twin_agree_on_empty_rows(monkeypatch):
    """Rows empty on one side keep the other; rows empty on both stay zero, never NaN (the
    Triton kernel under its interpreter where Triton is installed)."""
    gen = torch.Generator().manual_seed(3)
    acc, out = (torch.randn(1, 2, 6, 4, generator=gen) for _ in range(2))
    lse, lse_b = torch.randn(1, 2, 6, generator=gen), torch.randn(1, 2, 6, generator=gen)
    lse[..., :2], lse_b[..., 1:3] = float("-inf"), float("-inf")
    acc[..., :2, :] = 0.0
    want_acc, want_lse = acc.clone(), lse.clone()
    _merge_eager(want_acc, want_lse, out, lse_b)
    assert torch.equal(want_acc[..., 1, :], torch.zeros(1, 2, 4)) and torch.isfinite(want_acc).all()
    assert torch.allclose(want_acc[..., 0, :], out[..., 0, :]) and torch.allclose(want_acc[..., 2, :], acc[..., 2, :])
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from attnbench.impls.sequence_parallel import merge

    kernel = merge._kernel.__wrapped__()
    import triton

    got_acc, got_lse = acc.clone(), lse.clone()
    kernel[(1, 2)](
        got_acc,
        got_lse,
        out,
        lse_b,
        6,
        2,
        4,
        *got_acc.stride(),
        *got_lse.stride(),
        *out.stride(),
        *lse_b.stride(),
        BLOCK_M=8,
        BLOCK_D=triton.next_power_of_2(4),
    )
    assert torch.allclose(got_acc, want_acc, atol=1e-6) and torch.equal(got_lse.isinf(), want_lse.isinf())
    assert torch.allclose(got_lse[torch.isfinite(got_lse)], want_lse[torch.isfinite(want_lse)], atol=1e-6)
    assert merge_into is not None


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_layouts_cover_the_sequence_once(world):
    n = 48 * world
    for layout in (contiguous_positions, zigzag_positions):
        held = torch.cat([layout(n, world, r) for r in range(world)])
        assert torch.equal(torch.sort(held).values, torch.arange(n))
    # zigzag, literally: 2p chunks, rank r holds chunk r and chunk 2p-1-r
    c = n // (2 * world)
    for r in range(world):
        assert zigzag_positions(n, world, r).tolist() == [
            *range(r * c, (r + 1) * c),
            *range((2 * world - 1 - r) * c, (2 * world - r) * c),
        ]


@pytest.mark.parametrize("name", RING_IMPLS)
def test_declared_key_sets_are_the_counterparts(name):
    config = {
        "ring": {},
        "block-sparse-ring": {"pattern_type": "hierarchical", "block_size": 16, "sparsity_ratio": 0.25},
    }.get(name, {"segment_lengths": [8, 16], "dilation_rates": [1, 2]})
    impl = impls.build(name, **config)
    counterpart = {
        "ring": ("sdpa", {}),
        "ring-dilated": ("dilated", config),
        "ring-dilated-hilbert": ("dilated", {**config, "hilbert": True}),
        "block-sparse-ring": ("block-sparse", config),
    }[name]
    single = impls.build(counterpart[0], **counterpart[1])
    for causal in (False, True) if impl.supports_causal else (False,):
        assert torch.equal(impl.key_mask(128, 3, causal), single.key_mask(128, 3, causal))
        assert impl.useful_pairs(128, 3, causal) == single.useful_pairs(128, 3, causal)


def test_shape_rules_depend_on_the_ranks():
    ring = impls.build("ring")
    ring.world_size = 4
    with pytest.raises(ConfigError, match="multiple of 512"):
        ring.check_shape(768, 4)
    dil = impls.build("ring-dilated", segment_lengths=[512], dilation_rates=[1])
    dil.world_size = 2
    dil.check_shape(1024, 2)  # 512 per rank: whole segments
    dil.world_size = 4
    dil.check_shape(1024, 2)  # 256 per rank: two ranks tile a segment
    dil.world_size = 2
    with pytest.raises(ConfigError, match="neither hold whole segments"):
        dil.check_shape(1536, 2)  # 768 per rank: neither


# ---------------------------------------------------------------------------------------
# Across ranks: one torchrun per world size carries every case
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=[2, 4, 8], ids=lambda w: f"{w}-ranks")
def verified(request):
    """Every ring's default cases on 2, 4 and 8 gloo ranks (8: float32 alone, to keep 8 processes on
    a 2-core machine short)."""
    world = request.param
    dtypes = ["fp32", "bf16"] if world < 8 else ["fp32"]
    cases = [c for name in RING_IMPLS for c in default_cases(name, "cpu", dtypes, world=world)]
    return world, cases, seqpar.verify(cases)


@pytest.mark.slow
@pytest.mark.distributed
def test_every_case_matches_the_reference_and_the_single_device_output(verified):
    world, cases, checked = verified
    assert len(checked) == len(cases)
    failures = [(c, r) for c, r in checked if r.status != "pass"]
    assert not failures, failures[:3]
    for c, r in checked:
        assert c.world_size == world
        assert r.rel_err <= TOLERANCE[c.dtype] and r.rel_err_single <= TOLERANCE[c.dtype]


@pytest.mark.slow
@pytest.mark.distributed
def test_the_cases_cover_causal_exchange_and_uneven_layouts(verified):
    world, cases, _ = verified
    for name in ("ring", "ring-dilated", "block-sparse-ring"):
        assert {c.causal for c in cases if c.impl == name} == {True, False}
    assert {c.config["pattern_type"] for c in cases if c.impl == "block-sparse-ring"} == set(PATTERN_TYPES)
    # segments longer than a shard, so ranks exchange dilated K/V
    spanning = [
        c for c in cases if c.impl.startswith("ring-dilated") and max(c.config["segment_lengths"]) > c.seq_len // world
    ]
    assert spanning and {c.causal for c in spanning if c.impl == "ring-dilated"} == {True, False}
    assert any(c.batch > 1 for c in cases) and any(c.heads % len(c.config.get("segment_lengths", [1])) for c in cases)


#: per world size, [plan, batch] -> exchanges a call makes: (non-causal, causal at least, at most)
EXCHANGE_PLANS = {
    2: {("pieces", 1): (4, 2, 4)},
    4: {
        ("pieces", 1): (12, 6, 12),
        ("steps", 1): (3, 3, 3),
        ("gather", 1): (1, 3, 3),
        ("gather", 2): (1, 3, 3),
    },
}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("world", sorted(EXCHANGE_PLANS))
def test_every_exchange_plan_of_the_ring_matches_the_reference(world, monkeypatch):
    """Steps, pieces (each shard cut in 4) and one gathered exchange (non-causal; its keys
    attended in one call at batch 1, peer by peer at batch 2): every piece is received,
    attended and merged, causal and not, in the number of exchanges the plan makes
    (causal between two bounds: a zigzag sender's early half is fewer pieces). One launch
    per world size runs every plan."""
    import os
    from pathlib import Path

    from attnbench.runtime.distributed import launch

    tests = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")])))
    plans = EXCHANGE_PLANS[world]
    ended = launch(ring_exchanges, Plans(128 * world, list(plans)), world, "cpu", phase_limit_s=180)
    for rank in ended:
        assert rank.status == "ok", rank
        for (plan, batch), (flat, causal_low, causal_high) in plans.items():
            got = rank.result.found[f"{plan} batch={batch}"]
            assert got["causal=False"] <= TOLERANCE["fp32"] and got["causal=True"] <= TOLERANCE["fp32"], (plan, batch)
            assert got["exchanges causal=False"] == flat, (plan, batch)
            assert causal_low <= got["exchanges causal=True"] <= causal_high, (plan, batch)


@pytest.mark.distributed
def test_a_rank_that_raises_ends_the_run_with_its_error(monkeypatch):
    case = default_cases("ring", "cpu", ["fp32"], world=2)[0]
    launched, launch = [], seqpar.launch

    def short_collectives(*args, **kwargs):  # a collective timeout well inside every deadline
        launched.append(launch(*args, **{**kwargs, "collective_timeout_s": 30}))
        return launched[-1]

    monkeypatch.setattr(seqpar, "launch", short_collectives)
    ((_, check),) = seqpar.verify([case], fail_rank=1)  # rank 0 is already waiting for rank 1's K/V
    # rank 0 did not wait out its collective timeout: torchrun stopped it, or it failed at once
    # on the connection rank 1 left
    assert not_timed_out(launched[0][0]), launched[0][0]
    assert check.status == "error"
    assert check.message.startswith("rank 1:") and "asked to fail" in check.message


@pytest.mark.slow
@pytest.mark.distributed
def test_an_oom_on_the_ranks_is_the_agreed_trial_status():
    workload = dict(
        impl="ring",
        config={"backend": "auto"},
        batch=1,
        seq_len=1 << 18,
        heads=8,
        head_dim=64,
        dtype="fp32",
        device="cpu",
        mode="fwd",
        causal=False,
    )
    row = seqpar.run_trial(TrialSpec(workload=Workload(**workload), memory_limit=64 << 20, max_trial_seconds=30), 2)
    assert row.status == "oom", row.message
    assert row.message.startswith("rank ")
    assert row.times_ms == []


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.distributed
def test_bench_on_two_ranks_writes_rows_for_one_and_two(tmp_path, in_process):
    out = tmp_path / "run"
    proc = in_process(  # the command in this process; each trial in its own torchrun launch
        "bench",
        "--impl",
        "ring",
        "--seq-lens",
        "1024",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--heads",
        2,
        "--head-dim",
        16,
        "--gpus",
        2,
        "--max-trial-seconds",
        30,
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    rows, problems = read_rows(out)
    assert problems == []
    verify = [r for r in rows if r["kind"] == "verify"]
    assert sorted(r["world_size"] for r in verify) == [1, 2] and all(r["status"] == "pass" for r in verify)
    points = sorted((r for r in rows if r["kind"] == "points"), key=lambda r: r["world_size"])
    assert [(r["world_size"], r["strategy"], r["status"]) for r in points] == [(1, "ring", "ok"), (2, "ring", "ok")]
    assert points[0]["series"] != points[1]["series"]
    for r in points:
        assert len(r["ranks"]) == r["world_size"] and len(r["times_ms"]) >= 1
        assert r["time_ms"] == sorted(r["times_ms"])[len(r["times_ms"]) // 2] or len(r["times_ms"]) % 2 == 0
        assert all(x["compute_ms"] > 0 and x["comm_wait_ms"] >= 0 for x in r["ranks"])
        assert r["floor_bytes"] == 4 * 1024 * 2 * 16 * 4 // r["world_size"]  # q, k, v, out of one shard
        assert r["tokens_per_s"] == pytest.approx(1024 / (r["time_ms"] / 1e3))
        assert r["threads"] >= 1 and r["warmup_calls"] >= 0  # what its calls ran with, as a trial alone records
    # each of the 2 ranks sends its whole K and V shard once: 2 x 512 tokens x 2 heads x 16 x 4 bytes
    assert [x["sent_bytes"] for x in points[1]["ranks"]] == [2 * 512 * 2 * 16 * 4] * 2
    # a call's time is the slowest rank's
    assert points[1]["time_ms"] >= min(x["time_ms"] for x in points[1]["ranks"])


CPU = ["--device", "cpu", "--dtype", "fp32", "--heads", 4, "--head-dim", 16]
BAD = {
    "ranks not dividing N": (["bench", "--impl", "ring", "--seq-lens", "1280", "--gpus", 4, *CPU], "multiple of 512"),
    "shard not fitting the segments": (
        [
            "bench",
            "--impl",
            "ring-dilated",
            "--segment-lengths",
            "512",
            "--dilation-rates",
            "1",
            "--seq-lens",
            "1536",
            "--gpus",
            2,
            *CPU,
        ],
        "neither hold whole segments",
    ),
    "grid the length cannot form": (
        [
            "bench",
            "--impl",
            "ring-dilated-hilbert",
            "--segment-lengths",
            "256",
            "--dilation-rates",
            "1",
            "--param",
            "grid_width=100",
            "--seq-lens",
            "1024",
            "--gpus",
            2,
            *CPU,
        ],
        "grid of width 100",
    ),
    "blocks not splitting over the ranks": (
        ["bench", "--impl", "block-sparse-ring", "--param", "block_size=128", "--seq-lens", "1152", "--gpus", 2, *CPU],
        "multiple of 256",
    ),
    "more ranks than allowed": (["max-seq", "--impl", "ring", "--gpus", 999, *CPU], "--gpus 999"),
    "gpus for a single-device impl": (["max-seq", "--impl", "sdpa", "--gpus", 2, *CPU], "sequence-parallel"),
    "backward of a ring": (["max-seq", "--impl", "ring", "--mode", "fwd_bwd", "--gpus", 2, *CPU], "--mode fwd"),
    "causal Hilbert order": (
        ["max-seq", "--impl", "ring-dilated-hilbert", "--causal", "--gpus", 2, *CPU],
        "non-causal",
    ),
    "context-parallel on the CPU": (["max-seq", "--impl", "context-parallel", "--gpus", 2, *CPU], "runs on cuda"),
    "verify on too many ranks": (["verify", "--impl", "ring", "--device", "cpu", "--gpus", "999"], "--gpus 999"),
}


def run_in_process(args, capsys, monkeypatch):
    """The console entry in this process (no torch import per case): exit code, stdout, stderr."""
    monkeypatch.setenv("COLUMNS", "200")
    code = main_in_process(*args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_bad(code, stdout, stderr, hint, out):
    assert code == 2, (stdout, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and hint in lines[0], stderr
    assert "Traceback" not in stdout + stderr
    assert not out.exists()


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(name, tmp_path, capsys, monkeypatch):
    args, hint = BAD[name]
    out = tmp_path / "out"
    check_bad(
        *run_in_process([*args, *(["--out", out] if args[0] != "verify" else [])], capsys, monkeypatch), hint, out
    )


@pytest.mark.slow
def test_bad_input_from_the_real_command(tmp_path):
    args, hint = BAD["ranks not dividing N"]
    out = tmp_path / "out"
    proc = run_cli(*args, "--out", out)
    check_bad(proc.returncode, proc.stdout, proc.stderr, hint, out)


def test_gpus_setting_reads_one_count_as_baseline_plus_p():
    assert parse_gpus(2) == (1, 2)
    assert parse_gpus("1,2,4") == (1, 2, 4)
    assert parse_gpus("1") == (1,)
    with pytest.raises(ValueError):
        parse_gpus("0")


def test_scaling_readout_from_rows():
    base = {
        "impl": "ring",
        "config": {"backend": "auto"},
        "batch": 1,
        "heads": 8,
        "head_dim": 64,
        "dtype": "bf16",
        "device": "cuda",
        "mode": "fwd",
        "causal": False,
        "strategy": "ring",
        "status": "ok",
        "kind": "points",
    }
    rows = [
        {**base, "label": "ring x1", "world_size": 1, "seq_len": 1 << 20, "time_ms": 800.0},
        {
            **base,
            "label": "ring x2",
            "world_size": 2,
            "seq_len": 1 << 20,
            "time_ms": 500.0,
            "ranks": [
                {"rank": 0, "time_ms": 490.0, "compute_ms": 480.0, "comm_wait_ms": 5.0},
                {"rank": 1, "time_ms": 500.0, "compute_ms": 470.0, "comm_wait_ms": 25.0},
            ],
        },
        {**base, "impl": "sdpa", "strategy": "single", "world_size": 1, "seq_len": 1 << 20, "time_ms": 900.0},
    ]
    for p, longest in ((1, 1000), (2, 1950)):  # a search per rank count: its trials, then its answer
        search = {**base, "label": f"ring x{p}", "series": f"search x{p}", "world_size": p}
        rows += [
            {**search, "kind": "max-seq", "seq_len": longest, "time_ms": 1.0},
            {**search, "kind": "max-seq", "seq_len": 2 * longest, "status": "oom"},
            {**search, "kind": "max-seq-result", "seq_len": longest, "stopped_by": "memory"},
        ]
    from attnbench.report.tables.multigpu import rank_breakdown, ring_pairs, scaling_families

    from conftest import typed_row

    rows = [typed_row(**r) for r in rows]
    at_1m = [p for p in ring_pairs(rows) if p.row.seq_len == 1 << 20]
    two = [p for p in at_1m if p.world_size == 2]
    assert len(two) == 1 and len(at_1m) == 2  # ring x1 is a pair too; sdpa on one device is a baseline
    # against the equal-work baseline (sdpa over the whole sequence), the same split (ring x1) beside it
    assert two[0].baseline_text == "equal work: sdpa"
    assert two[0].speedup_ci.value == pytest.approx(1.8) and two[0].efficiency_ci.value == pytest.approx(0.9)
    assert two[0].efficiency_same_split == pytest.approx(0.8)
    assert max(r.comm_wait_ms for r in rank_breakdown(rows)) == 25.0  # the slowest rank's wait
    (family,) = scaling_families(rows)
    assert family.single.max_seq_len == 1000 and [s.max_seq_len for s in family.multi] == [1950]
    # the time cell is the median with its interval and sample count (one sample: no interval)
    assert two[0].time_ci.value == 500 and two[0].time_ci.n == 1


@pytest.mark.parametrize(
    "cuda_build, gpu, says",
    [(None, False, "not usable with this torch build"), ("12.8", False, "no CUDA GPU"), ("12.8", True, "available")],
)
def test_list_says_context_parallel_needs_cuda_where_there_is_none(monkeypatch, cuda_build, gpu, says):
    import torch

    from attnbench.impls.sequence_parallel import context_parallel as cp

    monkeypatch.setattr(cp, "context_parallel_support", lambda: "")  # the API is there: only the device differs
    monkeypatch.setattr(torch.version, "cuda", cuda_build)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    line = cp.context_parallel_availability()
    assert says in line and ("needs CUDA" in line) == (not gpu), line
