"""`attnbench list` and `attnbench verify`: what is registered, and whether each implementation
computes what it declares (against the float64 reference)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.cli.base import app, config_short, console, show
from attnbench.cli.options import impl_params, resolve_device
from attnbench.errors import AttnbenchError


@app.command("list")
def list_impls() -> None:
    """Every registered implementation, its parameters with defaults, devices and dtypes."""
    from attnbench import impls  # here, not at the top: `report` and `check` must not import torch

    for name in impls.names():
        s = impls.spec(name)
        console.print(f"[bold]{name}[/]  {s.summary}")
        console.print(
            f"    devices: {', '.join(s.devices)}   dtypes: {', '.join(s.dtypes)}"
            + ("   (multi-GPU, launched by torchrun)" if s.distributed else "")
        )
        if s.source:
            package = f" (package {s.source['package']} {s.source['version']})" if s.source.get("package") else ""
            console.print(f"    from {s.source['import_path']}{package}")
        if "availability" in s.extra:
            console.print(f"    {s.extra['availability']()}")
        if not s.params:
            console.print("    parameters: none")
        for p in s.params:
            choices = f" (one of {', '.join(p.choices)})" if p.choices else ""
            console.print(f"    --param {p.name}={show(p.default)}  {p.help}{choices}")


@app.command()
def verify(
    impl: Annotated[
        Optional[list[str]], typer.Option("--impl", help="implementation (repeatable); default: all")
    ] = None,
    device: Annotated[str, typer.Option(help="cpu | cuda | auto")] = "auto",
    dtype: Annotated[
        Optional[list[str]], typer.Option("--dtype", help="dtype (repeatable); default fp32 and bf16")
    ] = None,
    gpus: Annotated[
        Optional[str],
        typer.Option(
            "--gpus",
            help="ranks for the sequence-parallel implementations, e.g. 2 or 2,4 \\[default: 2; CUDA: 2 if there are 2 GPUs]",
        ),
    ] = None,
    out: Annotated[Optional[Path], typer.Option(help="also append the verify rows to DIR/trials.jsonl")] = None,
    mode: Annotated[str, typer.Option(help="fwd | fwd_bwd (also dq, dk, dv; single-device implementations)")] = "fwd",
    param: Annotated[
        Optional[list[str]],
        typer.Option(
            "--param",
            help="KEY=VALUE: verify the implementations that have this parameter at this value instead of their verify configurations (repeatable)",
        ),
    ] = None,
) -> None:
    """Check implementations against the float64 dense masked reference on fresh random inputs
    (sequence-parallel ones on several ranks, also against their single-device counterpart)."""
    from attnbench import impls
    from attnbench.environment import capture_env
    from attnbench.reference import GRAD_TOLERANCE, GRADIENTS, TOLERANCE, default_cases
    from attnbench.results import ResultsWriter, check_output_dir, check_same_machine, clean_floats
    from attnbench.sweeps import seqpar
    from attnbench.sweeps.verification import run_reference_checks
    from attnbench.workload import check_workload_fields

    if out:
        check_output_dir(out)
    names = impl or impls.names()
    for n in names:
        impls.spec(n)
    device = resolve_device(device)
    dtypes = dtype or ["fp32", "bf16"]
    for d in dtypes:
        check_workload_fields(d, mode, device)
    if mode == "fwd_bwd":
        names = _single_device_only(names, impl)
    runnable = [n for n in names if device in impls.spec(n).devices]
    single = [n for n in runnable if not impls.spec(n).distributed]
    distributed = [n for n in runnable if impls.spec(n).distributed]
    worlds = _verify_worlds(gpus, device) if distributed else []
    ranked = [
        c
        for n in distributed
        for w in worlds
        for c in seqpar.cases_for(n, device, [d for d in dtypes if d in impls.spec(n).dtypes], w)
    ]
    given = impl_params(None, None, None, param)
    configs = {
        n: [impls.normalize_config(n, {k: v for k, v in given.items() if k in {p.name for p in impls.spec(n).params}})]
        for n in names
        if given
    }
    cases = [
        c
        for n in single
        for c in default_cases(n, device, [d for d in dtypes if d in impls.spec(n).dtypes], mode, configs.get(n))
    ]
    broken = _contract_violations([n for n in single if impls.spec(n).source], device, dtypes, configs)
    if not cases and not ranked:
        raise AttnbenchError(
            f"no reference check to run: {', '.join(names)} cannot run {'/'.join(dtypes)} on {device}; "
            "see `attnbench list` for each implementation's devices and dtypes"
        )
    env = capture_env() if out else None
    if out:
        check_same_machine(out, env["machine"])
    with console.status(f"running {len(cases) + len(ranked)} reference checks on {device}"):
        rows = run_reference_checks(cases + ranked)
    t = Table(title=f"attnbench verify on {device}: relative error ||out - ref|| / ||ref|| against float64")
    grad_cols = ("dq err", "dk err", "dv err", "grad tol.") if mode == "fwd_bwd" else ()
    for col in (
        "impl",
        "config",
        "ranks",
        "B",
        "N",
        "H/Hkv",
        "D",
        "causal",
        "dtype",
        "rel. error",
        "vs single",
        "tolerance",
        *grad_cols,
        "result",
    ):
        t.add_column(col)
    for r in rows:
        err = "-" if r["rel_err"] is None else f"{r['rel_err']:.2e}"
        vs_single = "-" if r.get("rel_err_single") is None else f"{r['rel_err_single']:.2e}"
        grads = (
            [_sci(r.get(f"rel_err_{g}")) for g in GRADIENTS] + [f"{GRAD_TOLERANCE[r['dtype']]:.0e}"]
            if grad_cols
            else []
        )
        mark = {"pass": "[green]pass[/]", "fail": "[red]FAIL[/]"}.get(
            r["status"],
            f"[{'yellow' if r['status'] == 'unsupported' else 'red'}]{r['status']}[/] {escape(r['message'])}",
        )
        t.add_row(
            r["impl"],
            config_short(r["config"]),
            str(r.get("world_size", 1)),
            str(r["batch"]),
            str(r["seq_len"]),
            str(r["heads"]) + (f"/{r['kv_heads']}" if r.get("kv_heads") else ""),
            str(r["head_dim"]),
            "yes" if r["causal"] else "no",
            r["dtype"],
            err,
            vs_single,
            f"{TOLERANCE[r['dtype']]:.0e}",
            *grads,
            mark,
        )
    console.print(t)
    if out:
        writer = ResultsWriter(out)
        for r in rows:
            writer.append(clean_floats({**r, "run": Path(out).name, "env": env}))
    # a kernel without the shape (a backend with no grouped-query kernel) computed nothing wrong
    unsupported = [r for r in rows if r["status"] == "unsupported"]
    failed = [r for r in rows if r["status"] not in ("pass", "unsupported")]
    passed = len(rows) - len(failed) - len(unsupported)
    console.print(
        f"{passed} of {len(rows)} cases pass"
        + (f", {len(unsupported)} unsupported by the kernel" if unsupported else "")
    )
    for line in broken:
        console.print(f"[red]contract violated[/] {escape(line)}")
    if failed or broken:
        raise typer.Exit(1)


def _single_device_only(names: list[str], asked: list[str] | None) -> list[str]:
    """fwd_bwd checks single-device implementations; naming a sequence-parallel one is an error."""
    from attnbench import impls

    ranked = [n for n in names if impls.spec(n).distributed]
    if asked and ranked:
        raise AttnbenchError(
            f"verify --mode fwd_bwd checks single-device implementations; {', '.join(ranked)} "
            "runs forward only: drop --mode fwd_bwd or that --impl"
        )
    return [n for n in names if n not in ranked]


def _sci(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def _contract_violations(names: list[str], device: str, dtypes: list[str], configs: dict[str, list]) -> list[str]:
    """The contract checks of outside implementations (attnbench/contract.py), one line each."""
    from attnbench import impls
    from attnbench.contract import violations

    return [
        f"{n} [{dtype}]: {v}"
        for n in names
        for config in configs.get(n, [{}])
        for dtype in dtypes
        if dtype in impls.spec(n).dtypes
        for v in violations(n, config, device, dtype)
    ]


def _verify_worlds(gpus: str | None, device: str) -> list[int]:
    """Ranks to verify sequence-parallel implementations on: as given, else 2 (1 on a
    one-GPU machine)."""
    from attnbench.sweeps import seqpar
    from attnbench.units import parse_int_list

    if gpus is None:
        worlds = [min(2, max(1, seqpar.max_ranks(device)))]
    else:
        worlds = sorted(set(parse_int_list(gpus, "gpus")))
    for w in worlds:
        seqpar.check_world(device, w)
    return worlds
