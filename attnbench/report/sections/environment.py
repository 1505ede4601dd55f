"""The appendix: the environment each machine's rows were measured in, the commands that
produced them, and the reference checks among them."""

from __future__ import annotations

from typing import Any

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, distinct
from attnbench.report.fit import GIB
from attnbench.report.markdown import Table
from attnbench.report.sections import Section, register
from attnbench.results.series import short_commit


def command_text(command: str) -> str:
    """argv[0] as the user typed it: `attnbench` rather than the module's path."""
    head, _, rest = (command or "").partition(" ")
    if head.endswith(("attnbench/__main__.py", "/attnbench")) or head == "attnbench":
        head = "attnbench"
    return f"{head} {rest}".strip()


def gpu_text(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "none"
    names = distinct(g.get("name") for g in gpus)
    mem = distinct(round(g.get("memory_total_bytes", 0) / GIB, 1) for g in gpus)
    links = distinct(g.get("nvlinks_active") for g in gpus)
    text = f"{len(gpus)} × {' + '.join(names)} ({', '.join(f'{x} GiB' for x in mem)} each"
    return text + (f", {', '.join(map(str, links))} NVLinks active" if links else "") + ")"


def render(doc: Doc, m: Machine) -> None:
    envs = [vars(r.env) if r.env else {} for r in m.rows]  # each environment's fields by name
    dates = sorted(distinct(e.get("date") for e in envs))
    items = [
        ("GPUs", distinct(gpu_text(e.get("gpus") or []) for e in envs)),
        ("Driver", distinct(e.get("driver") for e in envs)),
        ("CUDA (torch build)", distinct(e.get("cuda") for e in envs)),
        ("cuDNN", distinct(e.get("cudnn") for e in envs)),
        ("NCCL", distinct(e.get("nccl") for e in envs)),
        ("torch", distinct(e.get("torch") for e in envs)),
        ("Python", distinct(e.get("python") for e in envs)),
        ("CPU", distinct(f"{e.get('cpu')} ({e.get('cpu_count')} cores)" for e in envs if e.get("cpu"))),
        ("NVML", distinct(e.get("nvml") for e in envs)),
        ("attnbench commit", distinct(e.get("commit") for e in envs)),
        ("Date", [f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else dates[0]] if dates else []),
        ("Host", distinct(e.get("hostname") for e in envs)),
    ]
    doc.table(
        Table.of("environment", {"Item": lambda i: i[0], "Value": lambda i: "; ".join(map(str, i[1])) or None}, items)
    )
    runs: dict[tuple, int] = {}
    for r in m.rows:
        key = (r.run, short_commit(r), command_text(r.env.command if r.env else ""))
        runs[key] = runs.get(key, 0) + 1
    doc.add(
        "\nThe commands that produced these rows (as recorded in each row's `env.command`), and the attnbench "
        "commit that ran them:\n"
    )
    columns = {
        "Run": lambda r: r[0][0],
        "Commit": lambda r: r[0][1],
        "Command": (lambda r: r[0][2], lambda c: f"`{c}`"),
        "Rows": lambda r: r[1],
    }
    doc.table(Table.of("commands", columns, runs.items()))
    verify = d.verifications(m.rows)
    if verify:
        doc.add("\nReference checks against the float64 masked reference (relative error ‖out − ref‖ / ‖ref‖):\n")
        columns = {
            "Implementation": lambda r: r.impl,
            "Config": lambda r: d.config_text(r.config) or None,
            "Dtype": lambda r: r.dtype,
            "Device": lambda r: r.device,
            "N": lambda r: r.seq_len,
            "Rel. Error": (lambda r: r.rel_err, lambda v: f"{v:.1e}"),
            "Tolerance": (lambda r: r.tolerance, lambda v: f"{v:.0e}"),
            "Result": lambda r: r.status,
        }
        doc.table(Table.of("reference-checks", columns, verify))


register(Section(90, "Environment and commands (appendix)", render))
