"""What an outside implementation can declare, and checks that can fail: a mask_mod built with
N and H, its own causal key sets, executed pairs, a minimum length, the grouped-head mapping;
the reference check at lengths where a sparse pattern is sparse; what a mismatch says; its
provenance; FLOPs counted after the measurement. Every count is held to a hand count."""

import os
import sys

import pytest

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.measure.timing import TimingPolicy
from attnbench.runtime.worker import close_spares
from attnbench.trials.contract import violations
from attnbench.trials.reference import (
    SPARSE_SHARE,
    Shapes,
    VerifyCase,
    default_cases,
    run_case,
    with_long_checks,
)
from attnbench.trials.trial import TrialSpec, execute, run_isolated
from attnbench.trials.workload import Workload

from conftest import ROOT

MODULE = '''
import time

import torch
import torch.nn.functional as F


def attend(q, k, v, keep):
    """softmax attention of (B, N, H, D) over the boolean (H or 1, N, N) key sets ``keep``"""
    out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=keep)
    return out.transpose(1, 2)


def positions(q):
    i = torch.arange(q.shape[1], device=q.device)
    return i[:, None], i[None, :]


class Window(torch.nn.Module):
    """keys at most ``window`` away; ``declare``: as a mask_mod, else nothing (dense)"""

    def __init__(self, window, declare=True, scale=1.0, zero_head=None, drop_rows=0, transpose=False):
        super().__init__()
        self.window, self.scale, self.zero_head = window, scale, zero_head
        self.drop_rows, self.transpose = drop_rows, transpose
        if declare:
            self.mask_mod = lambda b, h, q, kv: (q - kv).abs() <= window

    def forward(self, q, k, v, is_causal=False):
        t, u = positions(q)
        keep = (t - u).abs() <= self.window
        if is_causal:
            keep = keep & (u <= t)
        out = attend(q, k, v, keep) * self.scale
        if self.zero_head is not None:
            out[:, :, self.zero_head] = 0
        if self.transpose:
            return out.transpose(1, 2)
        return out[:, : out.shape[1] - self.drop_rows]


def hidden_window(window: int = 300):
    return Window(window, declare=False)


def wide_window(window: int = 5000):
    return Window(window)


def window(window: int = 64):
    return Window(window)


def zero_head():
    return Window(16, zero_head=1)


def doubled():
    return Window(16, scale=2.0)


def drops_rows():
    return Window(16, drop_rows=3)


def transposed():
    return Window(16, transpose=True)


class Neighbourhood(torch.nn.Module):
    """the k keys nearest a query, shifted at the ends of the sequence so there are always k
    (a window that needs N); causal: the k most recent keys, declared as its own"""

    def __init__(self, k, own_causal):
        super().__init__()
        self.k = k
        if own_causal:
            self.causal_mask_mod = lambda b, h, q, kv: (kv <= q) & (q - kv < k)

    def mask_mod_for(self, seq_len, num_heads):
        k, half = self.k, self.k // 2

        def mask_mod(b, h, q, kv):
            start = torch.clamp(q - half, min=0, max=max(seq_len - k, 0))
            return (kv >= start) & (kv < start + k)

        return mask_mod

    def forward(self, q, k, v, is_causal=False):
        n, (t, u) = q.shape[1], positions(q)
        if is_causal:
            keep = (u <= t) & (t - u < self.k)
        else:
            start = (t - self.k // 2).clamp(0, max(n - self.k, 0))
            keep = (u >= start) & (u < start + self.k)
        return attend(q, k, v, keep)


def neighbourhood(k: int = 24):
    return Neighbourhood(k, own_causal=True)


def neighbourhood_causal_undeclared(k: int = 24):
    return Neighbourhood(k, own_causal=False)


class HeadShare(torch.nn.Module):
    """head h sees keys within (h + 1) N / (4 H) of the query: a mask built with N and H"""

    def mask_mod_for(self, seq_len, num_heads):
        def mask_mod(b, h, q, kv):
            return (q - kv).abs() <= (h + 1) * seq_len // (4 * num_heads)

        return mask_mod

    def forward(self, q, k, v, is_causal=False):
        (b, n, heads, d), (t, u) = q.shape, positions(q)
        w = (torch.arange(heads, device=q.device) + 1) * n // (4 * heads)
        keep = (t - u).abs()[None] <= w[:, None, None]
        if is_causal:
            keep = keep & (u <= t)
        return attend(q, k, v, keep)


def head_share():
    return HeadShare()


class ThreeWindows(Window):
    """computes three windows per query and keeps one: executed pairs three times the useful"""

    def executed_pairs(self, seq_len, num_heads, causal):
        w = min(self.window, seq_len - 1)
        per_head = seq_len * (w + 1) - w * (w + 1) // 2 if causal else seq_len * (2 * w + 1) - w * (w + 1)
        return 3 * num_heads * per_head


def three_windows(window: int = 16):
    return ThreeWindows(window)


class Grouped(torch.nn.Module):
    """grouped K/V heads read interleaved: query head j reads K/V head j % H_kv"""

    supports_gqa = True

    def forward(self, q, k, v, is_causal=False):
        groups = q.shape[2] // k.shape[2]
        k, v = (x.repeat(1, 1, groups, 1) for x in (k, v))
        return attend(q, k, v, torch.ones(1, 1, dtype=torch.bool))


def interleaved_declared():
    m = Grouped()
    m.gqa_mapping = "interleaved"
    return m


def interleaved_undeclared():
    return Grouped()


class MinLength(Window):
    min_seq_len = 300


def min_length():
    return MinLength(400)


class SlowCount(Window):
    """a mask_mod that takes a minute per call: its count is stopped, its measurement kept"""

    def __init__(self):
        super().__init__(8)

        def mask_mod(b, h, q, kv):
            time.sleep(60)
            return (q - kv).abs() <= 8

        self.mask_mod = mask_mod


def slow_count():
    return SlowCount()


class LocalWindow(torch.nn.Module):
    """keys at most ``window`` away, a block of ``window`` queries at a time against the three
    blocks around it: memory linear in N, so a search ends where memory does"""

    def __init__(self, window, bounded):
        super().__init__()
        self.window = self.granularity = window
        if bounded:
            self.mask_mod = lambda b, h, q, kv: (q - kv).abs() <= window
        else:  # the same sets through an operation bounds cannot follow: a count pair by pair
            self.mask_mod = lambda b, h, q, kv: torch.cos((q - kv).float() * 0) * (q - kv).abs() <= window

    def forward(self, q, k, v, is_causal=False):
        b, n, h, d = q.shape
        w, blocks = self.window, q.shape[1] // self.window
        kb, vb = (F.pad(x, (0, 0, 0, 0, w, w)).unfold(1, 3 * w, w).permute(0, 1, 2, 4, 3) for x in (k, v))
        qb = q.view(b, blocks, w, h, d).permute(0, 1, 3, 2, 4)
        scores = torch.einsum("bnhtd,bnhsd->bnhts", qb, kb) / d**0.5
        start = torch.arange(blocks)[:, None, None] * w
        qpos, kpos = start + torch.arange(w)[:, None], start - w + torch.arange(3 * w)[None, :]
        keep = ((qpos - kpos).abs() <= w) & (kpos >= 0) & (kpos < n) & ((kpos <= qpos) | (not is_causal))
        scores = scores.masked_fill(~keep[None, :, None], float("-inf"))
        out = torch.einsum("bnhts,bnhsd->bnhtd", scores.softmax(-1), vb)
        return out.permute(0, 1, 3, 2, 4).reshape(b, n, h, d)


def local_window(window: int = 16):
    return LocalWindow(window, bounded=True)


def local_window_unbounded(window: int = 16):
    return LocalWindow(window, bounded=False)
'''


@pytest.fixture
def own(tmp_path, monkeypatch):
    (tmp_path / "ownattn.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{tmp_path}")
    impls.resolve_outside_with(None)  # a library: outside code is imported here
    sys.modules.pop("ownattn", None)
    close_spares()  # a spare worker started by an earlier test has the PYTHONPATH of before
    yield tmp_path
    close_spares()
    sys.modules.pop("ownattn", None)


def window_pairs(n: int, w: int, causal: bool) -> int:
    w = min(w, n - 1)
    return n * (w + 1) - w * (w + 1) // 2 if causal else n * (2 * w + 1) - w * (w + 1)


def check(name: str, n: int, heads: int = 4, kv_heads=None, causal=False, head_dim=16):
    return run_case(VerifyCase(name, {}, 1, n, heads, head_dim, causal, "fp32", "cpu", kv_heads=kv_heads), seed=3)


# --- verification that can fail ------------------------------------------------------------------


def test_a_window_wider_than_the_short_checks_declared_dense_fails_at_the_long_one(own):
    cases, warnings = with_long_checks(default_cases("ownattn:hidden_window", "cpu", ["fp32"], shapes=Shapes(False)))
    short = [c for c in cases if c.seq_len == 128]
    (long,) = [c for c in cases if c.seq_len > 128]
    assert all(run_case(c, seed=1).status == "pass" for c in short)  # inside a window of 300: dense
    assert long.seq_len > 2 * 300 + 1 and (long.heads, long.kv_heads, long.head_dim) == (8, 2, 16)
    failed = run_case(long, seed=1)
    assert failed.status == "fail" and "error per head" in failed.message
    assert warnings == []  # dense is what it declares


def test_a_sparse_pattern_is_checked_at_a_length_where_it_holds_under_half_the_pairs(own):
    cases, warnings = with_long_checks(default_cases("ownattn:window", "cpu", ["fp32"], shapes=Shapes(False)))
    (long,) = [c for c in cases if c.seq_len > 128]
    assert window_pairs(128, 64, False) / 128**2 >= SPARSE_SHARE  # dense at the verify length
    assert window_pairs(long.seq_len, 64, False) / long.seq_len**2 < SPARSE_SHARE
    assert window_pairs(long.seq_len // 2, 64, False) / (long.seq_len // 2) ** 2 >= SPARSE_SHARE  # the shortest
    assert run_case(long, seed=1).status == "pass" and warnings == []


def test_a_pattern_dense_at_every_affordable_length_is_warned_of(own):
    cases, warnings = with_long_checks(default_cases("ownattn:wide_window", "cpu", ["fp32"], shapes=Shapes(False)))
    (warning,) = warnings
    assert "hold at least half the pairs at every length" in warning and "N 128: 100%" in warning
    far = window_pairs(1 << 20, 5000, False) / 4**20
    assert f"they hold {far:.1%}" in warning


def test_a_sweeps_check_runs_at_its_heads_key_value_heads_and_head_dim(own):
    from attnbench.plan import build_plan
    from attnbench.sweeps.runner import resolve, verify_cases

    flags = {"kind": "points", "seq_lens": "1K", "device": "cpu", "dtype": "fp32"}
    flags |= {"heads": 6, "kv_heads": 2, "head_dim": 24, "batch": 3}
    cases, _ = verify_cases(resolve(build_plan("t", ["ownattn:window"], flags, {})))
    assert {(c.heads, c.kv_heads, c.head_dim) for c in cases} == {(6, 2, 24)}
    assert sorted((c.batch, c.seq_len) for c in cases) == [(1, 256), (2, 128)]


def test_a_dense_pattern_warning_is_printed_as_one_warning(own, capsys):
    """The run's reporter says a note is a warning; the note itself does not say so again."""
    from attnbench.cli.progress import RichReporter
    from attnbench.plan import build_plan
    from attnbench.results.schema import Environment
    from attnbench.sweeps.runner import SweepRunner, resolve

    flags = {"kind": "points", "seq_lens": "1K", "device": "cpu", "dtype": "fp32"}
    plan = resolve(build_plan("t", ["ownattn:wide_window"], flags, {}))
    SweepRunner(plan, own / "run", Environment(machine="cpu: test"), False, reporter=RichReporter()).planned_checks()
    (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("warning")]
    assert line.startswith("warning: ownattn:wide_window") and line.count("warning:") == 1


def test_verify_options_name_the_shapes(own):
    shapes = Shapes(False, seq_lens=(512, 1024), heads=6, kv_heads=3, head_dim=8)
    cases = default_cases("ownattn:window", "cpu", ["fp32"], shapes=shapes)
    assert {(c.seq_len, c.heads, c.kv_heads, c.head_dim) for c in cases} == {(512, 6, 3, 8), (1024, 6, 3, 8)}
    with pytest.raises(AttnbenchError, match="verify --seq-len 256: .*min_seq_len 300"):
        default_cases("ownattn:min_length", "cpu", ["fp32"], shapes=Shapes(False, seq_lens=(256,)))


# --- declarations --------------------------------------------------------------------------------


def test_a_mask_mod_built_with_n_and_h(own):
    impl = impls.build("ownattn:head_share")
    for n, heads in ((128, 4), (200, 3)):
        expected = sum(window_pairs(n, (h + 1) * n // (4 * heads), False) for h in range(heads))
        assert impl.useful_pairs(n, heads, False) == int(impl.key_mask(n, heads).sum()) == expected
    assert violations("ownattn:head_share", {}, "cpu", "fp32") == []
    assert check("ownattn:head_share", 256, heads=5).status == "pass"


def test_a_causal_window_of_the_k_most_recent_keys_is_its_own_declaration(own):
    n, k = 200, 24
    impl = impls.build("ownattn:neighbourhood")
    assert impl.useful_pairs(n, 2, True) == 2 * sum(min(t + 1, k) for t in range(n))  # the k most recent
    assert impl.useful_pairs(n, 2, False) == 2 * n * k  # k keys each, shifted at the ends
    assert violations("ownattn:neighbourhood", {}, "cpu", "fp32") == []
    assert check("ownattn:neighbourhood", 256, causal=True).status == "pass"
    # without its causal declaration the causal sets are the window's earlier half: the output disagrees
    found = violations("ownattn:neighbourhood_causal_undeclared", {}, "cpu", "fp32")
    assert any("with is_causal=True disagrees with the declared key sets" in v for v in found), found


def test_declared_executed_pairs_are_the_rows_and_named(own):
    spec = TrialSpec(
        workload=Workload(impl="ownattn:three_windows", seq_len=256, heads=2, head_dim=8, dtype="fp32", device="cpu"),
        timing=TimingPolicy(warmup=0, min_samples=1, max_samples=1, target_ms=1),
    )
    m = execute(spec)
    useful = 2 * window_pairs(256, 16, False)
    assert (m.status, m.pairs_counted, m.pairs_useful, m.pairs_executed) == ("ok", "blocks", useful, 3 * useful)
    assert m.flops_executed == 3 * m.flops_useful == 3 * 4.0 * 8 * useful
    assert "ownattn.ThreeWindows.executed_pairs" in m.pairs_source and m.count_s is not None


def test_a_minimum_length_is_where_checks_start_and_shorter_is_refused(own):
    impl = impls.build("ownattn:min_length")
    assert impl.verify_seq_len() == 300
    with pytest.raises(ConfigError, match="below its min_seq_len 300"):
        impl.check_shape(256, 2)


def test_the_grouped_head_mapping_is_declared_and_a_wrong_one_says_which_matches(own):
    assert check("ownattn:interleaved_declared", 128, heads=8, kv_heads=2).status == "pass"
    wrong = check("ownattn:interleaved_undeclared", 128, heads=8, kv_heads=2)
    assert wrong.status == "fail"
    assert "K/V head j % H_kv: declare gqa_mapping = 'interleaved'" in wrong.message


# --- what a mismatch says ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("factory", "said"),
    [
        ("zero_head", "heads 1 are all zero"),
        ("doubled", "the output is the reference times 2"),
        ("drops_rows", "it has 125 query rows for 128 queries (3 dropped)"),
        ("transposed", "it is (B, H, N, D); return out.transpose(1, 2)"),
    ],
)
def test_a_mismatch_names_its_cause(own, factory, said):
    got = check(f"ownattn:{factory}", 128)
    assert got.status in ("fail", "error") and said in got.message, got.message
    if got.status == "fail":
        assert "error per head 0:" in got.message


def test_the_contract_check_carries_the_same_diagnostics(own):
    (line, *_) = violations("ownattn:doubled", {}, "cpu", "fp32")
    assert "the output is the reference times 2" in line


# --- provenance ----------------------------------------------------------------------------------


def test_rows_record_the_source_hash_which_changes_with_the_code(own):
    first = impls.spec("ownattn:window").source
    assert first["import_path"] == "ownattn:window" and len(first["source_sha256"]) == 16
    (own / "ownattn.py").write_text(MODULE + "\n# an edit\n")
    sys.modules.pop("ownattn", None)
    impls.resolve_outside_with(None)  # forget the spec read before
    again = impls.spec("ownattn:window").source
    assert again["source_sha256"] != first["source_sha256"]


def test_an_outside_label_shows_every_parameter(own):
    from attnbench.plan import build_plan

    plan = build_plan("t", ["ownattn:window"], {"device": "cpu"}, {})
    assert plan.series[0].name == "ownattn:window(window=64)"  # its default, shown


# --- counted after the measurement ---------------------------------------------------------------


@pytest.mark.slow
def test_a_count_stopped_in_its_process_keeps_the_measurement(own):
    spec = TrialSpec(
        workload=Workload(impl="ownattn:slow_count", seq_len=256, heads=2, head_dim=8, dtype="fp32", device="cpu"),
        timing=TimingPolicy(warmup=0, min_samples=1, max_samples=1, target_ms=1),
        count_limit_s=1.0,
    )
    m = run_isolated(spec)
    assert m.status == "ok" and m.times_ms and m.peak_bytes, m  # measured, then stopped while counting
    assert m.pairs_counted == "unknown" and m.flops_useful is None
    # stopped at its own limit (the mask takes about a minute), named as counting
    assert "counting the pairs was stopped" in m.flops_unknown and "killed in phase counting" in m.flops_unknown


# --- end to end, as a user runs it -----------------------------------------------------------------

TINY = ["--device", "cpu", "--dtype", "fp32"]


def rows_of(out):
    import json

    return [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_verify_fails_a_hidden_window_and_prints_one_line_per_implementation(own):
    from conftest import run_cli

    env = {"PYTHONPATH": os.environ["PYTHONPATH"]}
    r = run_cli("verify", "--impl", "ownattn:hidden_window", "--impl", "ownattn:window", *TINY, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("ownattn:")]
    assert [line.split()[:2] for line in lines] == [["ownattn:hidden_window", "FAIL"], ["ownattn:window", "pass"]]
    assert "first failure at N=2048, H=8/2, fp32: relative error above tolerance; error per head" in r.stdout
    # the shapes the options name, exactly
    out = own / "v"
    r = run_cli(
        "verify", "--impl", "ownattn:window", *TINY, "--seq-len", "384,512", "--heads", "6", "--kv-heads", "3",
        "--head-dim", "8", "--out", out, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    shapes = {(x["seq_len"], x["heads"], x["kv_heads"], x["head_dim"]) for x in rows_of(out)}
    assert shapes == {(384, 6, 3, 8), (512, 6, 3, 8)}
    r = run_cli("verify", "--impl", "ownattn:window", *TINY, "--heads", "4", "--kv-heads", "3", env=env)
    assert r.returncode == 2 and "--kv-heads" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
def test_an_unverified_run_says_so_in_its_rows_and_report_and_knows_no_flops(own):
    from conftest import run_cli

    env = {"PYTHONPATH": os.environ["PYTHONPATH"]}
    out = own / "run"
    r = run_cli(
        "bench", "--impl", "ownattn:hidden_window", *TINY, "--heads", "2", "--head-dim", "8", "--seq-lens", "512",
        "--no-verify", "--out", out, env=env,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = [x for x in rows_of(out) if x["kind"] == "points"]
    assert not any(x["kind"] == "verify" for x in rows_of(out))
    assert row["verified"] is False and row["status"] == "ok" and row["time_ms"] > 0
    assert row["pairs_counted"] == "unknown" and "flops_useful" not in row
    assert "declares no key sets and was not verified" in row["flops_unknown"]
    assert row["impl_source"]["import_path"] == "ownattn:hidden_window" and row["impl_source"]["source_sha256"]
    r = run_cli("report", out, env={"PYTHONPATH": str(ROOT)})  # the report imports none of it
    assert r.returncode == 0, r.stderr
    md = (out / "report" / "report.md").read_text()
    assert md.split("\n## ")[2].startswith("Your implementations")  # right after the answer
    assert "[unverified] ownattn:hidden_window(window=300)" in md and "declares no key sets" in md


@pytest.mark.slow
def test_counting_never_costs_a_measurement_and_the_answer_is_the_implementations(own):
    """A window at 100K+ tokens: N^2 = 1e10 pairs and more one by one (minutes), by tiles
    seconds, after each trial's measurement; the search stops where memory does. The same sets
    through an operation bounds cannot follow: refused at once, time and memory kept."""
    from conftest import run_cli

    env = {"PYTHONPATH": os.environ["PYTHONPATH"]}
    settings = [*TINY, "--heads", "1", "--head-dim", "8", "--max-trial-seconds", "10", "--memory-limit", "256MiB"]
    out = own / "search"
    # a coarse resolution: the counting is what is tested here, not how closely the edge is found
    search = ("--start", "16K", "--resolution", "16K")
    r = run_cli("max-seq", "--impl", "ownattn:local_window", *settings, *search, "--out", out, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = rows_of(out)
    (result,) = [x for x in rows if x["kind"] == "max-seq-result"]
    assert result["stopped_by"] == "memory" and result["seq_len"] >= 65536
    ran = [x for x in rows if x["kind"] == "max-seq" and x["status"] == "ok"]
    for x in ran:
        n = x["seq_len"]
        assert (x["pairs_counted"], x["pairs_useful"]) == ("blocks", window_pairs(n, 16, False)), n
        assert x["flops_useful"] == 4.0 * 8 * window_pairs(n, 16, False)
    counted = [x["seq_len"] for x in ran if "count_s" in x]
    assert sorted(counted) == sorted({x["seq_len"] for x in ran})  # once per length: a confirmation is handed it
    out = own / "unbounded"
    roomy = [*settings[:-1], "512MiB"]  # 128K fits: 2^34 pair-by-pair evaluations are 131,072 tokens of one head
    r = run_cli(
        "bench", "--impl", "ownattn:local_window_unbounded", *roomy, "--seq-lens", "2K,160K", "--out", out, env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    short, long = sorted((x for x in rows_of(out) if x["kind"] == "points"), key=lambda x: x["seq_len"])
    assert (short["pairs_counted"], short["pairs_useful"]) == ("exact", window_pairs(2048, 16, False))
    assert long["status"] == "ok" and long["time_ms"] > 0 and long["peak_bytes"] > 0
    assert long["pairs_counted"] == "unknown" and "cannot bound" in long["flops_unknown"]
