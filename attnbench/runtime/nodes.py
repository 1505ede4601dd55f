"""Which node this attnbench is, of how many, and where the nodes meet; read from the command
line, torchrun's variables and SLURM's, and checked before torch is imported.

The same command runs on every node. Node 0 runs the command itself (plans, measures, writes
every row) and serves the run's store at the rendezvous endpoint; every other node runs node
0's multi-process trials with it, one torchrun per trial per node joined over c10d
(``runtime.cluster``). What each node's torchrun is given is decided here (``torchrun_args``),
as are the limits that keep a lost node from hanging the others.
"""

from __future__ import annotations

import errno
import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from attnbench.errors import AttnbenchError
from attnbench.units import brief

# The limits that turn a node that went away into a failed trial, never a hang.
MEET_S = 300.0  # every node reaches node 0's store at the start of a run
TRIAL_JOIN_S = 120  # every node's torchrun joins a trial's rendezvous (torchrun's join_timeout)
BEAT_S = 0.5  # each node's attnbench beats this often in the run's store
LOST_AFTER_S = 15.0  # a node whose beat stopped this long (or whose store connection broke) is lost
GOODBYE_S = 10.0  # node 0 waits this long at the end for the other nodes to hear that the run ended


@dataclass(frozen=True)
class Nodes:
    """This process's place among the nodes of a run (one node: ``count`` 1)."""

    count: int = 1
    rank: int = 0
    endpoint: str | None = None  # HOST:PORT of node 0's store

    @property
    def multi(self) -> bool:
        return self.count > 1

    @property
    def leads(self) -> bool:
        return self.rank == 0

    @property
    def host(self) -> str:
        return split_endpoint(self.endpoint or "")[0]

    @property
    def port(self) -> int:
        return split_endpoint(self.endpoint or "")[1]


ONE = Nodes()
_current = ONE


def use(nodes: Nodes) -> None:
    """Make ``nodes`` this process's nodes (the command line does, once options are checked)."""
    global _current
    _current = nodes


def current() -> Nodes:
    return _current


# --- reading them ---------------------------------------------------------------------------

# Where each value may come from, first found wins: the option, torchrun's variable for the
# same option, SLURM's.
SOURCES = {
    "nnodes": ("--nnodes", "PET_NNODES", "SLURM_NNODES"),
    "node_rank": ("--node-rank", "PET_NODE_RANK", "SLURM_NODEID"),
    "endpoint": ("--rdzv-endpoint", "PET_RDZV_ENDPOINT", "MASTER_ADDR"),
}


def from_options(
    nnodes: int | None, node_rank: int | None, endpoint: str | None, env: Mapping[str, str] | None = None
) -> Nodes:
    """This process's nodes from the options, else torchrun's variables, else SLURM's (an
    option wins); bad input raises ``AttnbenchError`` naming the fix."""
    env = os.environ if env is None else env
    count, count_from = _first("nnodes", nnodes, env)
    rank, rank_from = _first("node_rank", node_rank, env)
    count = _count(count, count_from)
    if count == 1:  # a rank the environment holds for another run is not this one's
        if node_rank not in (None, 0):
            raise AttnbenchError(f"{_named(rank_from, rank)} with one node: drop it, or give --nnodes N")
        return ONE
    if rank is None:
        raise AttnbenchError(
            f"{_named(count_from, count)} needs this node's rank: give --node-rank R (0 to {count - 1})"
        )
    rank = _integer(rank, rank_from)
    if not 0 <= rank < count:
        raise AttnbenchError(f"{_named(rank_from, rank)}: a node rank is 0 to {count - 1} with {count} nodes")
    if rank_from == "SLURM_NODEID" and env.get("SLURM_LOCALID", "0") != "0":
        raise AttnbenchError(
            "several attnbench tasks on one node (SLURM_LOCALID "
            f"{brief(env['SLURM_LOCALID'])}): run one per node, srun --ntasks-per-node=1"
        )
    return Nodes(count, rank, _endpoint(endpoint, env, count))


def _first(what: str, given, env: Mapping[str, str]) -> tuple[object, str]:
    option, *variables = SOURCES[what]
    if given is not None:
        return given, option
    for name in variables:
        if env.get(name, "").strip():
            return env[name].strip(), name
    return None, option


def _named(source: str, value) -> str:
    """How the user wrote the value: ``--nnodes 3`` or ``SLURM_NNODES='3'``."""
    shown = value if isinstance(value, int) else brief(str(value))
    return f"{source} {shown}" if source.startswith("--") else f"{source}={shown}"


def _integer(value, source: str) -> int:
    if isinstance(value, int):
        return value
    if not re.fullmatch(r"[0-9]+", str(value)):
        raise AttnbenchError(f"{_named(source, value)}: give a whole number")
    return int(value)


def _count(value, source: str) -> int:
    if value is None:
        return 1
    if isinstance(value, str) and ":" in value:
        raise AttnbenchError(f"{_named(source, value)}: attnbench runs a fixed number of nodes; give --nnodes N")
    count = _integer(value, source)
    if count < 1:
        raise AttnbenchError(f"{_named(source, value)}: give the number of nodes, at least 1")
    return count


def _endpoint(given: str | None, env: Mapping[str, str], count: int) -> str:
    endpoint, source = _first("endpoint", given, env)
    if endpoint is None:
        raise AttnbenchError(
            f"{count} nodes meet at node 0: give --rdzv-endpoint HOST:PORT (node 0's address and a free "
            "port; under SLURM export MASTER_ADDR and MASTER_PORT)"
        )
    if source == "MASTER_ADDR":
        port = env.get("MASTER_PORT", "").strip()
        if not port:
            raise AttnbenchError(f"MASTER_ADDR={brief(endpoint)} without MASTER_PORT: export MASTER_PORT too")
        endpoint, source = f"{endpoint}:{port}", "MASTER_ADDR:MASTER_PORT"
    split_endpoint(str(endpoint), source)
    return str(endpoint)


def split_endpoint(endpoint: str, source: str = "--rdzv-endpoint") -> tuple[str, int]:
    """``HOST:PORT`` (``[v6 address]:PORT`` too) as host and port."""
    m = re.fullmatch(r"\[([^\]]+)\]:([0-9]+)|([^:\[\]\s]+):([0-9]+)", endpoint)
    port = int(m.group(2) or m.group(4)) if m else 0
    if not m or not 0 < port < 65536:
        raise AttnbenchError(f"{_named(source, endpoint)}: write HOST:PORT, e.g. node0.cluster:29500")
    return m.group(1) or m.group(3), port


# --- checking them ------------------------------------------------------------------------


def check_ranks(nodes: Nodes, worlds: Iterable[int], option: str = "--gpus") -> None:
    """Every multi-process world spreads evenly over the nodes (a one-process trial runs on node 0)."""
    for world in sorted(set(worlds)):
        if world > 1 and world % nodes.count:
            low = max(nodes.count, world // nodes.count * nodes.count)
            raise AttnbenchError(
                f"{option} {world} over {nodes.count} nodes: each node runs the same number of ranks; "
                f"give a multiple of {nodes.count} (e.g. {low})"
            )


def check_endpoint_here(nodes: Nodes) -> None:
    """On node 0, which serves the run's store there: the endpoint's host names this machine
    and its port is free."""
    host, port = nodes.host, nodes.port
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except OSError as exc:
        raise AttnbenchError(f"--rdzv-endpoint {brief(nodes.endpoint)}: cannot resolve {brief(host)} ({exc})") from None
    if not any(_binds(address, 0) is None for address in addresses):
        raise AttnbenchError(
            f"--rdzv-endpoint {brief(nodes.endpoint)}: node 0 serves the rendezvous, so the host must name "
            "node 0 (under SLURM MASTER_ADDR is the job's first node)"
        )
    busy = _binds("", port)
    if busy is not None:
        raise AttnbenchError(
            f"--rdzv-endpoint {brief(nodes.endpoint)}: port {port} on node 0 is {busy}; choose another"
        )


def _binds(address: str, port: int) -> str | None:
    """None if a TCP socket binds ``address:port`` here, else why not."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError as exc:
            return "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
    return None


# --- what each node's torchrun is given ----------------------------------------------------------


def rendezvous_id(run: str, trial: int) -> str:
    """A trial's rendezvous id, from the run (node 0's label and its token) and the trial's
    number in it: the nodes' torchruns of one trial meet under it, and an agent left over
    from another trial or run never joins it."""
    return f"{re.sub(r'[^A-Za-z0-9_-]+', '-', run).strip('-')[:48]}-t{trial}"


def torchrun_args(nodes: Nodes, world: int, rdzv_id: str) -> list[str]:
    """This node's torchrun options for a trial of ``world`` ranks (``world / count`` here).
    Node 0's attnbench serves the store at the endpoint for the whole run, so no agent hosts it."""
    return [
        f"--nnodes={nodes.count}",
        f"--nproc-per-node={world // nodes.count}",
        f"--node-rank={nodes.rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={nodes.endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--rdzv-conf=is_host=false,join_timeout={TRIAL_JOIN_S}",
        "--max-restarts=0",
    ]
