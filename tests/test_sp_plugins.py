"""Sequence-parallel outside implementations: a user's module that runs on its rank's shard in
the process group attnbench starts (``factory.sequence_parallel``), verified on 2 gloo ranks
against the float64 reference and its declared counterpart, benched with --gpus 2 and
reported beside that counterpart, as the built-in rings are. The user's module gathers every
rank's keys and values and attends its own queries, in the layout it declares; one that
declares a layout it does not compute in must fail."""

import json
import os
import sys

import pytest

from attnbench import impls
from attnbench.errors import ConfigError
from attnbench.results import read_rows

from conftest import ROOT
from conftest import run_cli as run_anywhere

SP_MODULE = """
import torch
import torch.distributed as dist
import torch.nn.functional as F


def positions(layout, n, world, rank):
    if layout == "striped":
        return torch.arange(rank, n, world)
    if layout == "zigzag":
        c = n // (2 * world)
        late = 2 * world - 1 - rank
        return torch.cat([torch.arange(rank * c, (rank + 1) * c), torch.arange(late * c, (late + 1) * c)])
    return torch.arange(rank * (n // world), (rank + 1) * (n // world))


def gathered(x, world, where):
    shards = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(shards, x.contiguous())
    full = torch.empty(x.shape[0], x.shape[1] * world, *x.shape[2:], dtype=x.dtype)
    full[:, torch.cat(where)] = torch.cat(shards, 1)
    return full


class AllGather(torch.nn.Module):
    granularity = 16  # per rank

    def __init__(self, layout, computes_in=None):
        super().__init__()
        self.shard_layout = layout
        self.computes_in = computes_in or layout

    def forward(self, q, k, v, is_causal=False):
        world, rank = dist.get_world_size(), dist.get_rank()
        n = q.shape[1] * world
        where = [positions(self.computes_in, n, world, r) for r in range(world)]
        k, v = gathered(k, world, where), gathered(v, world, where)
        mask = torch.arange(n)[None, :] <= where[rank][:, None] if is_causal else None
        out = F.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (q, k, v)), attn_mask=mask)
        return out.transpose(1, 2)


def allgather(layout: str = "contiguous"):
    "every rank gathers all keys and values"
    return AllGather(layout)


allgather.sequence_parallel = {"counterpart": "sdpa"}


def mislaid():
    "declares striped shards, computes as if they were contiguous"
    return AllGather("striped", computes_in="contiguous")


mislaid.sequence_parallel = {"counterpart": "sdpa"}


def single():
    "a one-device module"
    return torch.nn.Identity()


def bad_declaration():
    return AllGather("contiguous")


bad_declaration.sequence_parallel = {"counterpart": "sdpa", "layout": "spiral"}
"""


def run_cli(*args):
    """The command line with the user's module importable (the fixture's PYTHONPATH)."""
    return run_anywhere(*args, env={"PYTHONPATH": os.environ["PYTHONPATH"]})


CPU = ["--device", "cpu", "--dtype", "fp32", "--heads", 2, "--head-dim", 8]


@pytest.fixture
def sp_module(tmp_path, monkeypatch):
    (tmp_path / "userring.py").write_text(SP_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{tmp_path}")
    sys.modules.pop("userring", None)
    yield tmp_path
    sys.modules.pop("userring", None)


def test_the_declaration_makes_it_sequence_parallel_with_its_counterpart(sp_module):
    spec = impls.spec("userring:allgather")
    assert spec.distributed and spec.counterpart == "sdpa"
    assert spec.source["sequence_parallel"] == {"counterpart": "sdpa", "counterpart_params": {}, "layout": "contiguous"}
    assert not impls.spec("userring:single").distributed
    # the counterpart the report compares with, read from what a row records
    assert impls.counterpart("userring:allgather", spec.source) == "sdpa"
    with pytest.raises(ConfigError, match="'spiral' is not one of contiguous, zigzag, striped"):
        impls.spec("userring:bad_declaration")


def test_what_a_worker_reads_of_it_reaches_attnbench_whole(sp_module):
    """The worker that imports outside code sends its spec and its builds to attnbench's own
    process typed: every field arrives (its source, which declares it sequence parallel,
    included), and the implementation built from it is sequence parallel, as the code is."""
    from attnbench.trials.supervised import DescribeSpec, describe_job

    found = describe_job(DescribeSpec("userring:allgather", 60))
    assert found.error is None and found.spec.distributed
    assert describe_job.read_result(describe_job.result_json(found)) == found
    (build,) = found.builds
    assert build.impl.code_source["sequence_parallel"]["counterpart"] == "sdpa"
    assert build.impl.shard_layout is not None


def test_its_shape_rules_follow_its_layout_and_the_ranks(sp_module):
    import torch

    striped = impls.build_for_ranks("userring:allgather", {"layout": "striped"}, 4)
    assert striped.granularity == 4 * 16
    assert striped.shard_positions(64, 1, False).tolist() == list(range(1, 64, 4))
    zigzag = impls.build_for_ranks("userring:allgather", {"layout": "zigzag"}, 2)
    assert zigzag.granularity == 2 * 2 * 16  # two chunks per rank
    assert torch.equal(zigzag.shard_positions(8 * 16, 0, True)[:32], torch.arange(32))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("layout", ["zigzag", "striped"])
def test_verify_on_two_ranks_checks_the_gathered_output_against_reference_and_counterpart(sp_module, tmp_path, layout):
    out = tmp_path / "v"
    proc = run_cli("verify", "--impl", "userring:allgather", "--param", f"layout={layout}", "--gpus", 2,
                   "--device", "cpu", "--dtype", "fp32", "--out", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    rows, _ = read_rows(out)
    assert rows and all(r["world_size"] == 2 and r["status"] == "pass" for r in rows)
    assert {r["causal"] for r in rows} == {False, True}
    assert all(r["counterpart"] == "sdpa" and r["rel_err_single"] < 1e-4 for r in rows)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_layout_declared_but_not_computed_fails_verify(sp_module):
    proc = run_cli("verify", "--impl", "userring:mislaid", "--gpus", 2, "--device", "cpu", "--dtype", "fp32")
    assert proc.returncode == 1, proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_bench_on_two_ranks_then_a_report_beside_its_counterpart(sp_module, tmp_path, in_process):
    out = tmp_path / "runs" / "ring"
    proc = run_cli("bench", "--impl", "userring:allgather", "--seq-lens", 1024, "--gpus", "1,2", *CPU,
                   "--max-trial-seconds", 30, "--out", out)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # the counterpart and the report need nothing of the user's module: run in this process
    single = in_process("bench", "--impl", "sdpa", "--seq-lens", 1024, *CPU, "--out", tmp_path / "runs" / "one")
    assert single.returncode == 0, single.stderr
    rows, problems = read_rows(out)
    assert problems == []
    points = [r for r in rows if r["kind"] == "points" and r["impl"] == "userring:allgather"]
    assert sorted(r["world_size"] for r in points) == [1, 2] and all(r["status"] == "ok" for r in points)
    two = next(r for r in points if r["world_size"] == 2)
    assert two["impl_source"]["sequence_parallel"]["counterpart"] == "sdpa" and len(two["ranks"]) == 2
    assert two["floor_bytes"] == 4 * 1024 * 2 * 8 * 4 // 2  # q, k, v and output of one shard
    assert two["verified"] is True
    report = in_process("report", tmp_path / "runs", "--out", tmp_path / "report")
    assert report.returncode == 0, report.stderr
    rings = (tmp_path / "report" / "csv").glob("*ring*.csv")
    text = "".join(p.read_text() for p in rings)
    assert "userring:allgather" in text and "sdpa" in text  # compared with its equal-work counterpart


def test_gpus_for_a_one_device_plugin_is_refused_naming_the_fix(sp_module):
    proc = run_cli("bench", "--impl", "userring:single", "--gpus", 2, "--seq-lens", 256, *CPU)
    assert proc.returncode == 2 and "runs on one device" in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, json.dumps(proc.stderr)
