"""Runs over several nodes: where this node's place comes from (options, torchrun's variables,
SLURM's), bad input refused before torch, what each node's torchrun is given, how a trial's
ranks are put together from the nodes' parts (a lost node named as the cause); and, with two
attnbench processes on this machine as two nodes of two gloo ranks each, ring verified and
benched with rows written once on node 0, a failed rank's message on both nodes, and a node
killed mid-trial failing the trial instead of hanging it."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from attnbench.errors import AttnbenchError
from attnbench.runtime import nodes as nodes_mod
from attnbench.runtime.jobs import Ended, RankEnded
from attnbench.runtime.nodes import (
    LOST_AFTER_S,
    TRIAL_JOIN_S,
    Nodes,
    check_endpoint_here,
    check_ranks,
    from_options,
    rendezvous_id,
    torchrun_args,
)

from conftest import ROOT, main_in_process, single_rank_spec

TESTS = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def one_node_after():
    """A command run in this process sets this process's nodes: the next test starts on one."""
    yield
    nodes_mod.use(nodes_mod.ONE)


# --- where the nodes come from ----------------------------------------------------------------


def test_one_node_unless_told_otherwise():
    assert from_options(None, None, None, env={}) == Nodes(1, 0, None)
    assert not from_options(None, None, None, env={}).multi


def test_an_option_wins_over_torchrun_and_slurm_and_torchrun_over_slurm():
    env = {
        "SLURM_NNODES": "4",
        "SLURM_NODEID": "3",
        "MASTER_ADDR": "n0",
        "MASTER_PORT": "29500",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_RDZV_ENDPOINT": "head:1234",
    }
    assert from_options(None, None, None, env=env) == Nodes(2, 1, "head:1234")
    assert from_options(3, 2, "other:5", env=env) == Nodes(3, 2, "other:5")
    slurm = {k: v for k, v in env.items() if not k.startswith("PET_")}
    assert from_options(None, None, None, env=slurm) == Nodes(4, 3, "n0:29500")
    assert from_options(1, None, None, env=slurm) == Nodes(1, 0, None)  # --nnodes 1 runs alone


def test_an_endpoint_is_host_and_port():
    assert Nodes(2, 0, "node0.cluster:29500").host == "node0.cluster"
    assert Nodes(2, 0, "[fd00::1]:29500").host == "fd00::1"
    assert Nodes(2, 0, "[fd00::1]:29500").port == 29500


BAD_NODES = {
    "a rank past the last node": ((2, 2, "h:1"), {}, "0 to 1"),
    "no rank": ((2, None, "h:1"), {}, "--node-rank R"),
    "no endpoint": ((2, 1, None), {}, "--rdzv-endpoint HOST:PORT"),
    "an endpoint without a port": ((2, 1, "h"), {}, "HOST:PORT"),
    "port 0": ((2, 1, "h:0"), {}, "HOST:PORT"),
    "no nodes": ((0, None, None), {}, "at least 1"),
    "an elastic range": ((None, None, None), {"PET_NNODES": "1:2"}, "fixed number of nodes"),
    "a rank with one node": ((1, 1, None), {}, "drop it"),
    "MASTER_ADDR without MASTER_PORT": ((2, 1, None), {"MASTER_ADDR": "n0"}, "MASTER_PORT"),
    "a second task on one node": (
        (None, None, None),
        {"SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_LOCALID": "1", "MASTER_ADDR": "n0", "MASTER_PORT": "1"},
        "--ntasks-per-node=1",
    ),
    "a rank that is not a number": ((None, None, "h:1"), {"PET_NNODES": "2", "PET_NODE_RANK": "one"}, "whole number"),
}


@pytest.mark.parametrize("name", list(BAD_NODES))
def test_bad_nodes_are_refused_naming_the_fix(name):
    given, env, fix = BAD_NODES[name]
    with pytest.raises(AttnbenchError, match=re.escape(fix)):
        from_options(*given, env=env)


def test_every_multi_process_world_spreads_evenly():
    check_ranks(Nodes(2, 0, "h:1"), [1, 2, 4, 8])  # one rank runs on node 0 alone
    with pytest.raises(AttnbenchError, match="--gpus 6 over 4 nodes.*multiple of 4 \\(e.g. 4\\)"):
        check_ranks(Nodes(4, 0, "h:1"), [1, 4, 6])


def test_node_0_serves_the_endpoint_on_its_own_free_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(AttnbenchError, match=f"port {port} on node 0 is in use"):
            check_endpoint_here(Nodes(2, 0, f"127.0.0.1:{port}"))
    with pytest.raises(AttnbenchError, match="must name node 0"):
        check_endpoint_here(Nodes(2, 0, "192.0.2.1:29500"))  # TEST-NET-1: never this machine's


@pytest.mark.slow
def test_bad_nodes_are_refused_with_one_line(capsys):
    for args, fix in (
        (["--nnodes", "2", "--node-rank", "1"], "--rdzv-endpoint HOST:PORT"),
        (["--gpus", "3", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:1"], "multiple of 2"),
        (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "192.0.2.1:29500"], "must name node 0"),
    ):
        assert main_in_process("bench", "--impl", "ring", "--seq-lens", "1K", "--device", "cpu", *args) == 2, fix
        err = capsys.readouterr().err
        assert err.startswith("error: ") and fix in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_nodes_are_checked_before_torch_is_imported():
    proc = subprocess.run(
        [sys.executable, "-m", "attnbench", "verify", "--impl", "ring", "--gpus", "3", "--nnodes", "2"]
        + ["--node-rank", "1", "--rdzv-endpoint", "h:1"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONPROFILEIMPORTTIME": "1"},
        timeout=120,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")}
    errors = [line for line in proc.stderr.splitlines() if not line.startswith("import time")]
    assert proc.returncode == 2 and errors == [errors[0]] and "multiple of 2" in errors[0], proc.stderr[-500:]
    assert imported and "torch" not in imported


# --- what each node's torchrun is given ------------------------------------------------------------


def test_each_node_runs_its_share_of_the_ranks_on_the_trials_own_rendezvous():
    args = torchrun_args(Nodes(2, 1, "n0:29500"), 8, "bench-1a2b-t3")
    assert "--nproc-per-node=4" in args and "--nnodes=2" in args and "--node-rank=1" in args
    assert "--rdzv-backend=c10d" in args and "--rdzv-endpoint=n0:29500" in args and "--rdzv-id=bench-1a2b-t3" in args
    # node 0's attnbench serves the store: no agent hosts one
    assert f"--rdzv-conf=is_host=false,join_timeout={TRIAL_JOIN_S}" in args


def test_a_trials_rendezvous_is_its_own():
    ids = {rendezvous_id(run, t) for run in ("bench-1a2b3c4d", "bench-5e6f7a8b") for t in (1, 2)}
    assert len(ids) == 4
    assert re.fullmatch(r"[A-Za-z0-9_-]+", rendezvous_id("my run/with odd:chars-1a2b", 7))


# --- a trial's ranks from the nodes' parts ---------------------------------------------------------


def _part(node, ranks, outcome=None, expected=2):
    from attnbench.runtime.cluster import NodePart

    return NodePart(node, ranks, expected, outcome or Ended("error", ""))


def test_a_lost_nodes_ranks_are_the_trials_cause():
    """Node 0's ranks fail first on broken connections; the node that went away is named."""
    from attnbench.runtime.cluster import combine_parts, part_failure
    from attnbench.runtime.distributed import agreed_status

    broken = [RankEnded(r, "error", "on node 0: Connection closed by peer", failed_at=1.0) for r in (1, 3)]
    parts = {0: _part(0, broken)}
    results = combine_parts(parts, 4, {1: "no heartbeat for 15 s"})
    assert [r.rank for r in results] == [0, 1, 2, 3]
    assert agreed_status(results) == ("killed", "rank 0: node 1 was lost: no heartbeat for 15 s")
    assert part_failure(parts[0]).startswith("rank 1 error")


def test_a_node_whose_launcher_failed_gives_its_ranks_its_account():
    from attnbench.runtime.cluster import combine_parts, part_failure
    from attnbench.runtime.distributed import agreed_status

    stopped = Ended("killed", "stopped: node 1: ...", stopped=True)
    failed = Ended("error", "the launcher exited with 1: RendezvousTimeoutError")
    parts = {0: _part(0, [], stopped), 1: _part(1, [], failed)}
    assert part_failure(parts[1]) == failed.message
    status, message = agreed_status(combine_parts(parts, 4, {}))
    assert status == "error" and message == "rank 0: on node 1: the launcher exited with 1: RendezvousTimeoutError"
    # a node whose ranks all left their results tells nothing, however its launcher ended
    finished = Ended("error", "trial process exited with 0 before writing its result")
    ok = [RankEnded(r, "ok", result={"times_ms": [1.0]}) for r in (0, 1)]
    parts = {0: _part(0, ok, finished), 1: _part(1, [], failed)}
    assert agreed_status(combine_parts(parts, 4, {}))[1] == f"rank 2: on node 1: {failed.message}"


def test_every_rank_ok_is_a_whole_trial():
    from attnbench.runtime.cluster import combine_parts, part_failure

    ok = [RankEnded(r, "ok", result={"times_ms": [1.0]}) for r in range(4)]
    parts = {0: _part(0, ok[2:]), 1: _part(1, ok[:2])}
    assert part_failure(parts[0]) is None
    assert combine_parts(parts, 4, {}) == ok


# --- two nodes on this machine -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_command(rank: int, port: int, out: Path, *args) -> list[str]:
    nodes = ["--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}"]
    return [sys.executable, "-m", "attnbench", *map(str, args), *nodes, "--out", str(out / f"node{rank}")]


def start_node(command: list[str]) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)]), "COLUMNS": "200"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def run_two_nodes(tmp_path: Path, *args, timeout: float = 300) -> tuple[subprocess.CompletedProcess, ...]:
    """The same command on node 0 and node 1 (each with its own results directory)."""
    port = free_port()
    procs = [start_node(node_command(rank, port, tmp_path, *args)) for rank in (0, 1)]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return tuple(done)


def rows(directory: Path) -> list[dict]:
    return [json.loads(line) for line in (directory / "trials.jsonl").read_text().splitlines()]


RING = ["--impl", "ring", "--device", "cpu", "--gpus", "4", "--dtype", "fp32"]


@pytest.mark.slow
@pytest.mark.distributed
def test_ring_verified_over_two_nodes_writes_its_rows_once_on_node_0(tmp_path):
    """Each check gathers the four ranks' outputs on rank 0 (either node's) and compares them with
    the float64 reference; node 0 alone writes the rows."""
    node0, node1 = run_two_nodes(tmp_path, "verify", *RING)
    assert node0.returncode == 0, node0.stdout[-2000:] + node0.stderr[-2000:]
    assert node1.returncode == 0, node1.stdout[-2000:] + node1.stderr[-2000:]
    checks = rows(tmp_path / "node0")
    assert checks and all(r["world_size"] == 4 and r["status"] == "pass" for r in checks)
    assert all(r["rel_err"] <= 1e-5 for r in checks)  # fp32 against float64: rounding, not a wrong shard
    assert checks[0]["env"]["nodes"] == [socket.gethostname()] * 2
    assert not (tmp_path / "node1").exists()
    assert re.search(r"trial verify-\w+-t1: ok", node1.stdout), node1.stdout


@pytest.mark.slow
@pytest.mark.distributed
def test_ring_benched_over_two_nodes_writes_its_rows_once_on_node_0(tmp_path):
    args = ("bench", *RING, "--seq-lens", "512", "--heads", "2", "--head-dim", "16")
    node0, node1 = run_two_nodes(tmp_path, *args)
    assert node0.returncode == 0 and node1.returncode == 0, node0.stderr[-2000:] + node1.stderr[-2000:]
    written = rows(tmp_path / "node0")
    points = {r["world_size"]: r for r in written if r["kind"] == "points"}
    assert sorted(points) == [1, 4] and all(r["status"] == "ok" for r in points.values())
    assert [line["rank"] for line in points[4]["ranks"]] == [0, 1, 2, 3]  # every rank's part reached node 0
    assert all(line["time_ms"] > 0 for line in points[4]["ranks"])
    checks = [r for r in written if r["kind"] == "verify" and r["world_size"] == 4]
    assert checks and all(r["status"] == "pass" for r in checks)
    assert not (tmp_path / "node1").exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failed_ranks_message_reaches_every_node(tmp_path, monkeypatch):
    """Node 0 here is this process (leading the run as the command line does), node 1 a
    command's follower: a collective over both nodes has its closed-form sum on every rank,
    and a rank asked to fail is named on both nodes."""
    from attnbench.cli.options import across_nodes, nodes_of
    from attnbench.runtime.distributed import agreed_status, launch

    from distributed_selftest import Faults, selftest

    port = free_port()
    follower = start_node(node_command(1, port, tmp_path, "verify", *RING))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    nodes = nodes_of(2, 0, f"127.0.0.1:{port}", worlds=[4])
    with across_nodes(nodes, "selftest"):
        summed = launch(selftest, Faults(), 4, "cpu", phase_limit_s=120)
        failed = launch(selftest, Faults(fail_rank=3), 4, "cpu", phase_limit_s=120)
    out, err = follower.communicate(timeout=120)
    assert [r.rank for r in summed] == [0, 1, 2, 3]
    assert all(r.status == "ok" and r.result.sum == 1 + 2 + 3 + 4 for r in summed), summed
    status, message = agreed_status(failed)
    assert status == "error" and message.startswith("rank 3: on node ") and "rank 3 was asked to fail" in message
    assert follower.returncode == 0, err[-2000:]
    assert f"error: {message}" in out, out  # the same message on node 1


def rank_pids(attnbench_pid: int) -> list[int]:
    """The rank processes a node's attnbench started (their job lives in its temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(cmdline).decode(errors="replace")
        if f"attnbench-dist-{attnbench_pid}-" in text and "torch.distributed.run" not in text:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
@pytest.mark.distributed
def test_a_node_killed_mid_trial_fails_the_trial_on_the_other_node(tmp_path):
    """Node 1's attnbench is killed once its ranks run: node 0 records the trial as failed by the
    lost node, within the limit it states (a beat missing for LOST_AFTER_S), well before the
    rendezvous's or a collective's own timeout could end it."""
    port = free_port()
    node0 = start_node(node_command(0, port, tmp_path, "verify", *RING))
    node1 = start_node(node_command(1, port, tmp_path, "verify", *RING))
    for line in node1.stdout:  # node 1 started its part of the trial
        if "ranks here" in line:
            break
    while len(rank_pids(node1.pid)) < 2:  # its two ranks are running
        assert node1.poll() is None, node1.stderr.read()
        time.sleep(0.1)
    node1.send_signal(signal.SIGKILL)
    node1.wait()
    guard = 2 * LOST_AFTER_S + 30  # no hang: far below the rendezvous's TRIAL_JOIN_S and the collectives' 300 s
    assert guard < TRIAL_JOIN_S
    out, err = node0.communicate(timeout=guard)
    assert node0.returncode == 1, out[-2000:] + err[-2000:]
    checks = rows(tmp_path / "node0")
    assert checks and all(r["status"] == "error" and "node 1 was lost" in r["message"] for r in checks), checks
    assert re.fullmatch(r"rank [0-3]: node 1 was lost: .*", checks[0]["message"])
    assert not (tmp_path / "node1").exists()
    assert not rank_pids(node1.pid)  # its ranks went with it


@pytest.mark.slow
def test_another_node_makes_the_single_output_its_mp_ranks_compare_with(tmp_path):
    """Node 0's single trial saves its output on node 0's disk; a node without it makes the
    same from the same seeded inputs before its mp ranks compare; where it is there already,
    nothing is made."""
    import torch

    from attnbench.trials import strategies
    from attnbench.trials.placed import OutputCheck
    from attnbench.trials.placed_job import context, measure, single_output_here

    spec = single_rank_spec(tmp_path / "node0", seed=5, samples=(3, 3), target_ms=10)
    assert measure(strategies.get("single"), context(spec), spec).status == "ok"
    elsewhere = OutputCheck(reference_dir=str(tmp_path / "node1"), role="measure", remake_reference=True)
    mp_rank = context(spec, rank=1, world=2, local_rank=0)
    assert single_output_here(spec, elsewhere, mp_rank) == tmp_path / "node1"
    for b in range(2):
        assert torch.equal(torch.load(tmp_path / "node0" / f"out{b}.pt"), torch.load(tmp_path / "node1" / f"out{b}.pt"))
    assert single_output_here(spec, replace(elsewhere, reference_dir=str(tmp_path / "node0")), mp_rank) is None


def own_tmp() -> list[str]:
    """A command prefix that gives a node a /tmp of its own, as a machine of its own has (a
    mount namespace); skips where this machine does not allow one."""
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("unshare -m is not permitted here: a node cannot have a /tmp of its own")
    if any(Path(p).resolve().is_relative_to("/tmp") for p in (ROOT, sys.prefix)):
        pytest.skip("this checkout or its environment lives under /tmp, which a node's own /tmp would hide")
    return ["unshare", "-m", "sh", "-c", 'mount -t tmpfs tmpfs /tmp && exec "$@"', "sh"]


@pytest.mark.slow
@pytest.mark.distributed
def test_speedup_mp_over_two_nodes_checks_every_ranks_output(tmp_path):
    """Node 1 has its own /tmp, so node 0's single-GPU output is not there: its ranks compare
    with the one it makes, and the row's output check covers all four ranks."""
    args = ("speedup", "--impl", "naive", "--device", "cpu", "--gpus", "4", "--strategy", "mp", "--cases", "256x4")
    args += ("--dtype", "fp32", "--heads", "2", "--head-dim", "16")
    port = free_port()
    node1 = start_node(own_tmp() + node_command(1, port, tmp_path, *args))
    node0 = start_node(node_command(0, port, tmp_path, *args))
    for proc in (node0, node1):
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-2000:] + err[-2000:]
    mp = [r for r in rows(tmp_path / "node0") if r["kind"] == "speedup" and r["strategy"] == "mp"]
    assert len(mp) == 1 and mp[0]["status"] == "ok" and mp[0]["world_size"] == 4, mp
    assert mp[0]["output_match"] and mp[0]["output_rel_err"] <= 1e-4  # fp32's tolerance, over every rank's share
