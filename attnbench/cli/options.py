"""What several commands share: the option types of the sweep commands, ``--param`` and flag
handling, the device choice and the name of a results directory written without ``--out``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from attnbench.errors import AttnbenchError
from attnbench.units import brief

ImplOpt = Annotated[
    Optional[list[str]], typer.Option("--impl", help="implementation (repeatable); see `attnbench list`")
]
HeadsOpt = Annotated[Optional[int], typer.Option("--heads", help="attention heads H \\[default: 8]")]
HeadDimOpt = Annotated[Optional[int], typer.Option("--head-dim", help="head dimension D \\[default: 64]")]
KvHeadsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--kv-heads", help="key/value heads shared by groups of query heads (divides --heads) \\[default: --heads]"
    ),
]
ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", help="a model's heads, kv heads, head dim and mask, e.g. llama3-8b (attnbench models)"),
]
BatchOpt = Annotated[Optional[int], typer.Option("--batch", help="batch size B \\[default: 1]")]
DtypeOpt = Annotated[Optional[str], typer.Option("--dtype", help="fp32 | fp16 | bf16 \\[default: bf16]")]
DeviceOpt = Annotated[Optional[str], typer.Option("--device", help="cpu | cuda | auto \\[default: auto]")]
ModeOpt = Annotated[Optional[str], typer.Option("--mode", help="fwd | fwd_bwd \\[default: fwd]")]
CausalOpt = Annotated[
    Optional[bool], typer.Option("--causal/--no-causal", help="causal masking \\[default: no-causal]")
]
SegOpt = Annotated[Optional[str], typer.Option("--segment-lengths", help="dilated: e.g. 2048,4096")]
DilOpt = Annotated[Optional[str], typer.Option("--dilation-rates", help="dilated: e.g. 1,2")]
BackendOpt = Annotated[Optional[str], typer.Option("--backend", help="sdpa: auto|flash|cudnn|efficient|math")]
ParamOpt = Annotated[
    Optional[list[str]], typer.Option("--param", help="any implementation parameter, KEY=VALUE (repeatable)")
]
TrialSecOpt = Annotated[
    Optional[float],
    typer.Option("--max-trial-seconds", help="one call longer than this is a time-limit \\[default: 60]"),
]
SearchBudgetOpt = Annotated[
    Optional[float],
    typer.Option(
        "--search-budget",
        help="a search starts no trial it expects to end after this many seconds (its answer is then a lower bound) \\[default: 300 on the CPU, 3600 on a GPU]",
    ),
]
MemLimitOpt = Annotated[Optional[str], typer.Option("--memory-limit", help="cap a trial's memory, e.g. 2GiB")]
ProfileOpt = Annotated[Optional[str], typer.Option("--profile", help="TOML profile (file or name under profiles/)")]
OutOpt = Annotated[
    Optional[Path], typer.Option("--out", help="results directory \\[default: runs/<date>-<machine>-<name>]")
]
ResumeOpt = Annotated[bool, typer.Option("--resume", help="continue an interrupted sweep in --out")]
GpusOpt = Annotated[
    Optional[str],
    typer.Option("--gpus", help="sequence-parallel implementations: ranks, e.g. 2 (runs 1 and 2) or 1,2,4"),
]
InProcOpt = Annotated[
    Optional[bool],
    typer.Option("--in-process/--isolate", help="run trials in this process instead of one fresh process each"),
]
BudgetOpt = Annotated[
    Optional[float], typer.Option("--timing-budget", help="seconds of timed calls per trial \\[default: 30]")
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
    typer.Option("--repeat", help="time each point in K fresh processes (the unit `check` compares) \\[default: 1]"),
]


def impl_params(segment_lengths, dilation_rates, backend, param) -> dict[str, Any]:
    params = {"segment_lengths": segment_lengths, "dilation_rates": dilation_rates, "backend": backend}
    for item in param or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise AttnbenchError(f"--param {brief(item)}: write KEY=VALUE, e.g. --param max_chunk_tokens=65536")
        params[key.strip().replace("-", "_")] = value.strip()
    return {k: v for k, v in params.items() if v is not None}


def sweep_flags(**kw) -> dict[str, Any]:
    if kw.get("isolate") is not None:
        kw["isolate"] = not kw["isolate"]  # the option is --in-process
    return {k: v for k, v in kw.items() if v is not None}


def resolve_device(device: str) -> str:
    from attnbench.sweeps.runner import cuda_available

    if device not in ("auto", "cpu", "cuda"):
        raise AttnbenchError(f"unknown device {brief(device)}: choose cpu, cuda or auto")
    if device == "auto":
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        raise AttnbenchError("--device cuda but no CUDA GPU is visible: run on a GPU machine or use --device cpu")
    return device


def dated_results_dir(machine: str, name: str) -> Path:
    """runs/DATE-MACHINE-NAME (runs/ is not tracked by git), with -2, -3, ... appended rather than mixing into an earlier run."""
    from attnbench.results import now_utc

    slug = re.sub(r"[^a-z0-9]+", "-", f"{machine}-{name}".lower()).strip("-")
    base = Path("runs") / f"{now_utc()[:10]}-{slug}"
    path, i = base, 2
    while (path / "trials.jsonl").exists():
        path, i = base.with_name(f"{base.name}-{i}"), i + 1
    return path
