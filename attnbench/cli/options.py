"""What several commands share: the option types of the sweep commands, ``--param`` and flag
handling, the device choice and the name of a results directory written without ``--out``."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.markup import escape

from attnbench.cli.base import console, err_console
from attnbench.errors import AttnbenchError, interrupt_exit_code
from attnbench.runtime.nodes import Nodes, check_endpoint_here, check_ranks, from_options, use
from attnbench.units import brief

if TYPE_CHECKING:
    from attnbench.impls.config import Config
    from attnbench.plan.settings import SettingValue, SettingValues


def impl_names(given: list[str] | None) -> list[str] | None:
    """``--impl`` values, each repeatable or a comma-separated list as ``--gpus`` and ``--strategy`` take
    (no implementation name holds a comma)."""
    if given is None:
        return None
    names = [name.strip() for value in given for name in value.split(",") if name.strip()]
    if not names:
        raise AttnbenchError("--impl names no implementation: give a name (see `attnbench list`)")
    return names


ImplOpt = Annotated[
    Optional[list[str]],
    typer.Option(
        "--impl",
        metavar="NAME",
        callback=impl_names,
        help="implementation (repeatable, or a list: a,b); see `attnbench list`",
    ),
]
HeadsOpt = Annotated[Optional[int], typer.Option("--heads", metavar="H", help="attention heads H \\[default: 8]")]
HeadDimOpt = Annotated[Optional[int], typer.Option("--head-dim", metavar="D", help="head dimension D \\[default: 64]")]
KvHeadsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--kv-heads",
        metavar="H",
        help="key/value heads shared by groups of query heads (divides --heads) \\[default: --heads]",
    ),
]
ModelOpt = Annotated[
    Optional[str],
    typer.Option(
        "--model",
        metavar="NAME",
        help="a model's heads, kv heads, head dim and mask, e.g. llama3-8b (attnbench models)",
    ),
]
BatchOpt = Annotated[Optional[int], typer.Option("--batch", metavar="B", help="batch size B \\[default: 1]")]
DtypeOpt = Annotated[
    Optional[str], typer.Option("--dtype", metavar="DTYPE", help="fp32 | fp16 | bf16 \\[default: bf16]")
]
DeviceOpt = Annotated[
    Optional[str], typer.Option("--device", metavar="DEVICE", help="cpu | cuda | auto \\[default: auto]")
]
ModeOpt = Annotated[Optional[str], typer.Option("--mode", metavar="MODE", help="fwd | fwd_bwd \\[default: fwd]")]
CausalOpt = Annotated[
    Optional[bool], typer.Option("--causal/--no-causal", help="causal masking \\[default: no-causal]")
]
SegOpt = Annotated[Optional[str], typer.Option("--segment-lengths", metavar="LIST", help="dilated: e.g. 2048,4096")]
DilOpt = Annotated[Optional[str], typer.Option("--dilation-rates", metavar="LIST", help="dilated: e.g. 1,2")]
BackendOpt = Annotated[
    Optional[str], typer.Option("--backend", metavar="NAME", help="sdpa: auto, flash, cudnn, efficient or math")
]
ParamOpt = Annotated[
    Optional[list[str]],
    typer.Option("--param", metavar="KEY=VALUE", help="any implementation parameter, KEY=VALUE (repeatable)"),
]
TrialSecOpt = Annotated[
    Optional[float],
    typer.Option("--max-trial-seconds", metavar="S", help="one call longer than this is a time-limit \\[default: 60]"),
]
SearchBudgetOpt = Annotated[
    Optional[float],
    typer.Option(
        "--search-budget",
        metavar="S",
        help="a search starts no trial it expects to end after this many seconds (its answer is then a lower bound) \\[default: 300 on the CPU, 3600 on a GPU]",
    ),
]
MemLimitOpt = Annotated[
    Optional[str], typer.Option("--memory-limit", metavar="SIZE", help="cap a trial's memory, e.g. 2GiB")
]
ProfileOpt = Annotated[
    Optional[str], typer.Option("--profile", metavar="NAME", help="TOML profile (file or name under profiles/)")
]
OutOpt = Annotated[
    Optional[Path], typer.Option("--out", metavar="DIR", help="results directory \\[default: runs/DATE-MACHINE-NAME]")
]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue an interrupted sweep in --out")]
GpusOpt = Annotated[
    Optional[str],
    typer.Option(
        "--gpus", metavar="RANKS", help="sequence-parallel implementations: ranks, e.g. 2 (runs 1 and 2) or 1,2,4"
    ),
]
InProcOpt = Annotated[
    Optional[bool],
    typer.Option("--in-process/--isolate", help="run trials in this process instead of one fresh process each"),
]
BudgetOpt = Annotated[
    Optional[float],
    typer.Option("--timing-budget", metavar="S", help="seconds of timed calls per trial \\[default: 30]"),
]
NoVerifyOpt = Annotated[
    bool,
    typer.Option(
        "--no-verify",
        help="run without the reference check first (a method with no exact reference); rows say verified: false",
    ),
]
RepeatOpt = Annotated[
    Optional[int],
    typer.Option(
        "--repeat", metavar="K", help="time each point in K fresh processes (the unit `check` compares) \\[default: 1]"
    ),
]
ThreadsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--threads", help="CPU trials: torch threads per trial process (times compare at one count) \\[default: 1]"
    ),
]

NnodesOpt = Annotated[
    Optional[int],
    typer.Option(
        "--nnodes",
        help="machines the run spans, each running this same command; node 0 writes every row \\[default: PET_NNODES, SLURM_NNODES, else 1]",
    ),
]
NodeRankOpt = Annotated[
    Optional[int],
    typer.Option("--node-rank", help="this machine's node rank, 0 to N-1 \\[default: PET_NODE_RANK, SLURM_NODEID]"),
]
EndpointOpt = Annotated[
    Optional[str],
    typer.Option(
        "--rdzv-endpoint",
        help="HOST:PORT on node 0 where the nodes meet (c10d rendezvous) \\[default: PET_RDZV_ENDPOINT, MASTER_ADDR:MASTER_PORT]",
    ),
]


def nodes_of(nnodes: int | None, node_rank: int | None, endpoint: str | None, worlds: Iterable[int] = ()) -> Nodes:
    """This machine's place among the run's nodes, checked (before torch is imported) with
    the ranks every multi-process trial spreads over them; node 0 checks it can serve the
    endpoint."""
    nodes = from_options(nnodes, node_rank, endpoint)
    check_ranks(nodes, worlds)
    if nodes.multi and nodes.leads:
        check_endpoint_here(nodes)
    use(nodes)
    return nodes


@contextmanager
def across_nodes(nodes: Nodes, label: str) -> Iterator[list[str] | None]:
    """Run a command's body on node 0, with the other nodes running its multi-process trials
    (yields the nodes' host names; None on one node). Any other node does not run the body:
    it runs node 0's trials until node 0 ends the run, then exits with node 0's exit code."""
    if not nodes.multi:
        yield None
        return
    from attnbench.runtime import cluster

    def say(line: str) -> None:
        console.print(escape(line))

    if not nodes.leads:
        try:
            code = cluster.Follower(nodes, say).follow()
        except cluster.NodeLost as exc:
            err_console.print(f"error: {escape(str(exc))}")
            raise typer.Exit(1) from None
        raise typer.Exit(code)
    leader = cluster.Leader(nodes, label, say)
    code, why = 1, None
    try:
        leader.meet()
        yield leader.hosts
        code = 0
    except typer.Exit as exc:
        code = exc.exit_code
        raise
    except KeyboardInterrupt as exc:
        code, why = interrupt_exit_code(exc), "interrupted"
        raise
    except BaseException as exc:
        code, why = (2 if isinstance(exc, AttnbenchError) else 1), str(exc) or type(exc).__name__
        raise
    finally:
        leader.end(code, why)


def impl_params(segment_lengths, dilation_rates, backend, param) -> Config:
    params: Config = {"segment_lengths": segment_lengths, "dilation_rates": dilation_rates, "backend": backend}
    for item in param or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise AttnbenchError(f"--param {brief(item)}: write KEY=VALUE, e.g. --param max_chunk_tokens=65536")
        params[key.strip().replace("-", "_")] = value.strip()
    return {k: v for k, v in params.items() if v is not None}


def settings_given(options: dict[str, SettingValue]) -> SettingValues:
    """The settings the command line gives, by key: an option left out (None) gives none;
    ``isolate`` is the opposite of its option, --in-process."""
    values = {k: v for k, v in options.items() if v is not None}
    if "isolate" in values:
        values["isolate"] = not values["isolate"]
    return values


def resolve_device(device: str) -> str:
    """The device a command runs on, as every series resolves its own (``auto``: cuda where
    a GPU is visible)."""
    from attnbench.sweeps.kinds.base import resolved_device
    from attnbench.sweeps.runner import cuda_available

    if device not in ("auto", "cpu", "cuda"):
        raise AttnbenchError(f"unknown device {brief(device)}: choose cpu, cuda or auto")
    return resolved_device(device, device != "cpu" and cuda_available())  # no CUDA query for the CPU


def dated_results_dir(machine: str, name: str) -> Path:
    """runs/DATE-MACHINE-NAME (runs/ is not tracked by git), with -2, -3, ... appended rather than mixing into an earlier run."""
    from attnbench.results import now_utc

    slug = re.sub(r"[^a-z0-9]+", "-", f"{machine}-{name}".lower()).strip("-")
    base = Path("runs") / f"{now_utc()[:10]}-{slug}"
    path, i = base, 2
    while (path / "trials.jsonl").exists():
        path, i = base.with_name(f"{base.name}-{i}"), i + 1
    return path
