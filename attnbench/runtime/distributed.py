"""Multi-process jobs under ``torchrun``: one process per GPU (NCCL) or per CPU rank (gloo).

``launch`` starts ``torchrun --standalone --nproc-per-node P`` with ``attnbench.runtime.distributed JOB``
as each rank (both through ``runtime.agent``, so a rank dies with its agent whenever that dies)
and supervises it like a single-process trial (a single rank runs directly, with the
environment torchrun would give it). Each rank finds the rank job the job file names
(``runtime.jobs``: ``run(spec, place) -> result``, typed, sent as JSON), runs it and writes
how it ended (``RankEnded``), success or failure. A rank that fails writes its error and exits
at once: torchrun then stops every other rank, so no rank waits forever in a collective, and
the caller reads which rank failed and why. A collective timeout and the parent's phase
deadline are the last resorts.

Several nodes: while node 0 leads a run over them (``runtime.cluster``), ``launch`` hands a
multi-process job to it, and each node runs its share of the ranks through ``run_on_node``
under torchrun joined to the trial's c10d rendezvous; a rank on a node that was lost is
``killed`` with ``outcome`` ``NODE_LOST``, and is the trial's cause.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from attnbench.measure import oom
from attnbench.results.schema import received
from attnbench.runtime import agent
from attnbench.runtime.jobs import Ended, Job, JobFile, Place, RankEnded, find_job
from attnbench.runtime.supervise import Child, cgroup_oom_kills, claim_protocol, classify_exit
from attnbench.runtime.worker import owned_temp_dir, write_json_atomic

S = TypeVar("S")

# The ``outcome`` of a rank whose node was lost in a run over several nodes.
NODE_LOST = "node-lost"

# NVLink multicast (NVLS) can take a shared host's GPUs out of service: keep it off.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def launch(
    job: Job[S, Any] | str,
    spec: S,
    nprocs: int,
    device: str,
    phase_limit_s: float,
    collective_timeout_s: float = 300.0,
    memory_limit: int | None = None,
) -> list[RankEnded]:
    """Run the rank job ``job`` (or its ``"module:function"``) with ``spec`` on ``nprocs``
    ranks: how each ended, in rank order, with its result typed as the job's. In a run over
    several nodes (``across_nodes`` is set) the ranks of a multi-process job are spread over
    them; a one-process job runs here.

    A rank that left no result (killed by torchrun after another rank failed, or by the
    deadline) is "killed" with the launcher's account; the failing rank says why.
    ``memory_limit`` (bytes a rank may use) is evidence for telling the OOM killer from
    another kill, as for a one-process trial.
    """
    job = find_job(job, ranked=True) if isinstance(job, str) else job
    sent = JobFile(job.name, job.spec_json(spec), device, collective_timeout_s)
    if nprocs > 1 and across_nodes is not None:
        ended = across_nodes(sent, nprocs, phase_limit_s, memory_limit)
    else:
        found, outcome = run_on_node(sent, nprocs, phase_limit_s, memory_limit)
        ended = [found.get(rank) or left_nothing(rank, outcome) for rank in range(nprocs)]
    return [e if e.result is None else replace(e, result=job.read_result(e.result, f"rank {e.rank}")) for e in ended]


# Set by ``runtime.cluster`` while node 0 leads a run over several nodes: spreads a
# multi-process job's ranks over them, each node's share through ``run_on_node``.
across_nodes: Callable[[JobFile, int, float, int | None], list[RankEnded]] | None = None


def run_on_node(
    sent: JobFile,
    nprocs: int,
    phase_limit_s: float,
    memory_limit: int | None = None,
    rdzv: list[str] | None = None,
    stop: Callable[[], str | None] | None = None,
) -> tuple[dict[int, RankEnded], Ended]:
    """This node's ranks of the job file ``sent``: how each rank that left a record (or that
    torchrun's summary says a signal ended) ended, by rank, its result still JSON; and how the
    launcher ended. ``rdzv``: this node's torchrun options in a run over several nodes (else
    one node, standalone); ``stop``: asked while the launcher runs, a reason it gives ends the
    launcher (another node's ranks failed, or a node was lost)."""
    with owned_temp_dir("dist") as tmp:
        job_path = Path(tmp) / "job.json"
        write_json_atomic(job_path, sent)
        worker = agent.command("rank", __name__, str(job_path), tmp)
        if nprocs == 1 and rdzv is None:
            # one rank needs no agent: set torchrun's environment ourselves and save its start-up;
            # the rank dies with attnbench, as it would with its agent
            cmd = [sys.executable, *worker]
            env = {**MULTICAST_OFF, **_single_rank_env(), agent.AGENT_PID: str(os.getpid())}
        else:
            standalone = ["--standalone", f"--nproc-per-node={nprocs}", "--max-restarts=0"]
            torchrun = (*(rdzv or standalone), *worker)
            cmd, env = [sys.executable, *agent.command("agent", "torch.distributed.run", *torchrun)], MULTICAST_OFF
        oom_kills = cgroup_oom_kills()
        launcher = Child(cmd, env)
        stopped = _stop_when(launcher, stop) if stop else {}
        outcome = launcher.watch(phase_limit_s, memory_limit)
        if stopped:
            outcome = Ended("killed", f"stopped: {stopped['why']}", stopped=True)
        # a rank that died of a signal attnbench did not send (the deadline's is the launcher's time-limit)
        signals = {} if outcome.status == "time-limit" or stopped else rank_signals(launcher.stderr_tail)
        evidence = {"oom_kills": (oom_kills, cgroup_oom_kills()), "memory_limit": memory_limit}
        found: dict[int, RankEnded] = {}
        for path in Path(tmp).glob("rank*.json"):
            ended = received(RankEnded, json.loads(path.read_text()), path.stem)
            found[ended.rank] = ended
        for rank, sig in signals.items():
            if rank not in found:
                died = classify_exit(-sig, [], evidence, what="the rank's process")
                found[rank] = RankEnded(rank, died.status, died.message, signal=sig)
        return found, outcome


def left_nothing(rank: int, outcome: Ended) -> RankEnded:
    """A rank that left no result: the launcher's account of how the job ended."""
    return RankEnded(rank, "killed", outcome.message or "stopped before writing a result", outcome=outcome.status)


def _stop_when(launcher: Child, stop: Callable[[], str | None]) -> dict[str, str]:
    """End the launcher's process group (its ranks with it) once ``stop`` gives a reason; the
    reason lands in the returned dict."""
    stopped: dict[str, str] = {}

    def poll() -> None:
        while launcher.proc.poll() is None:
            why = stop()
            if why:
                stopped["why"] = why
                try:
                    os.killpg(launcher.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                return
            time.sleep(0.25)

    threading.Thread(target=poll, daemon=True).start()
    return stopped


# torchrun's failure summary names each rank that failed and how it ended ("rank      : 1
# (local_rank: 1)", then "exitcode  : -9 (pid: 4241)  (SIGKILL)"): a negative code is a signal.
_RANK_LINE = re.compile(r"\s*rank\s*:\s*(\d+)")
_EXIT_LINE = re.compile(r"\s*exitcode\s*:\s*(-?\d+)")


def rank_signals(lines) -> dict[int, int]:
    """Rank -> the signal that ended it, from torchrun's failure summary."""
    found, rank = {}, None
    for line in lines:
        if m := _RANK_LINE.match(line):
            rank = int(m.group(1))
        elif (m := _EXIT_LINE.match(line)) and rank is not None:
            if int(m.group(1)) < 0:
                found[rank] = -int(m.group(1))
            rank = None
    return found


def _single_rank_env() -> dict[str, str]:
    with socket.socket() as s:  # a free port for the rank's own rendezvous store
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def agreed_status(ranks: list[RankEnded]) -> tuple[str, str]:
    """One status for all ranks: any failure fails the trial; an OOM anywhere is an OOM."""
    failed = [r for r in ranks if r.status != "ok"]
    if not failed:
        return "ok", ""
    # the root cause is an OOM if any rank ran out, else a rank a signal ended (its peers then
    # fail on a broken connection), else the rank that failed first (the others then fail on a
    # broken connection or are stopped by torchrun). torchrun stops a failed rank's peers with
    # SIGTERM: such a rank is no cause where another wrote why it failed, and any other signal
    # comes before it. A rank whose node was lost is a cause as a signalled one is (its peers
    # then fail on broken connections), before any signal.
    ooms = [r for r in failed if r.status in ("oom", "host-oom")]
    wrote_why = any(r.failed_at is not None for r in failed)
    lost = [r for r in failed if r.outcome == NODE_LOST]
    signalled = [r for r in failed if r.signal and not (r.signal == signal.SIGTERM and wrote_why)]
    signalled.sort(key=lambda r: r.signal == signal.SIGTERM)
    if ooms or not (lost or signalled):
        first = min(ooms or failed, key=lambda r: r.failed_at if r.failed_at is not None else float("inf"))
    else:
        first = (lost or signalled)[0]
    status = first.status
    said_how = first.signal or first.outcome == NODE_LOST
    if status == "killed" and not said_how:  # no rank said why: the deadline, the OOM killer, a crash
        status = first.outcome if first.outcome in ("time-limit", "host-oom", "killed") else "error"
    return status, f"rank {first.rank}: {first.message}"


def main(job_path: str, out_dir: str) -> None:
    """A rank (started through ``runtime.agent``, which made it die with its agent first)."""
    claim_protocol()  # phase lines reach the supervisor through torchrun's stdout, and nothing else does
    sent = received(JobFile, json.loads(Path(job_path).read_text()), "the job file")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    device = sent.device
    result_path = Path(out_dir) / f"rank{rank}.json"
    try:
        job = find_job(sent.job, ranked=True)
        spec = job.read_spec(sent.spec)
        if device == "cuda":
            torch.cuda.set_device(local_rank)
        dist.init_process_group(
            "nccl" if device == "cuda" else "gloo",
            timeout=dt.timedelta(seconds=sent.collective_timeout_s),
            **({"device_id": torch.device("cuda", local_rank)} if device == "cuda" else {}),
        )
        result = job.run(spec, Place(rank, world, device, local_rank))
    except BaseException as exc:  # write why, then leave at once so torchrun stops the others
        status = oom.classify(exc) if isinstance(exc, Exception) else "error"
        failed = RankEnded(rank, status, oom.one_line(exc), failed_at=time.time())
        write_json_atomic(result_path, failed)
        sys.stderr.write(f"attnbench rank {rank} failed: {oom.one_line(exc)}\n")
        sys.stderr.flush()
        os._exit(1)
    ended = RankEnded.finished(rank, result)
    write_json_atomic(result_path, replace(ended, result=job.result_json(result)))
    dist.destroy_process_group()


if __name__ == "__main__":  # a rank without the agent's guard (by hand): it dies with its parent
    agent.die_with_parent()
    main(sys.argv[1], sys.argv[2])
