"""The appendix: the environment each machine's rows were measured in, the commands that
produced them, and the reference checks among them."""

from __future__ import annotations

from typing import Any

from attnbench.report import data as d
from attnbench.report.document import Doc, Machine, distinct
from attnbench.report.fit import GIB
from attnbench.report.markdown import Table
from attnbench.report.sections import Section, register


def command_text(command: str) -> str:
    """argv[0] as the user typed it: `attnbench` rather than the module's path."""
    head, _, rest = (command or "").partition(" ")
    if head.endswith(("attnbench/__main__.py", "/attnbench")) or head == "attnbench":
        head = "attnbench"
    return f"{head} {rest}".strip()


def _fields(env) -> dict[str, Any]:
    """An environment's fields by name (empty where a row has none)."""
    if env is None:
        return {}
    return {f: getattr(env, f) for f in env.__dataclass_fields__ if f != "extra"}


def gpu_text(gpus: list[dict[str, Any]]) -> str:
    if not gpus:
        return "none"
    names = distinct(g.get("name") for g in gpus)
    mem = distinct(round(g.get("memory_total_bytes", 0) / GIB, 1) for g in gpus)
    links = distinct(g.get("nvlinks_active") for g in gpus)
    text = f"{len(gpus)} × {' + '.join(names)} ({', '.join(f'{x} GiB' for x in mem)} each"
    return text + (f", {', '.join(map(str, links))} NVLinks active" if links else "") + ")"


def render(doc: Doc, m: Machine) -> None:
    envs = [_fields(r.env) for r in m.rows]
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
        Table(
            "environment",
            ["Item", "Value"],
            [{"Item": k, "Value": "; ".join(map(str, v)) if v else None} for k, v in items],
        )
    )
    runs: dict[tuple, int] = {}
    for r in m.rows:
        key = (r.run, d.short_commit(r), command_text(r.env.command if r.env else ""))
        runs[key] = runs.get(key, 0) + 1
    doc.add(
        "\nThe commands that produced these rows (as recorded in each row's `env.command`), and the attnbench "
        "commit that ran them:\n"
    )
    doc.table(
        Table(
            "commands",
            ["Run", "Commit", "Command", "Rows"],
            [{"Run": run, "Commit": commit, "Command": cmd, "Rows": n} for (run, commit, cmd), n in runs.items()],
            {"Command": lambda c: f"`{c}`"},
        )
    )
    verify = d.verifications(m.rows)
    if verify:
        doc.add("\nReference checks against the float64 masked reference (relative error ‖out − ref‖ / ‖ref‖):\n")
        doc.table(
            Table(
                "reference-checks",
                ["Implementation", "Config", "Dtype", "Device", "N", "Rel. Error", "Tolerance", "Result"],
                [
                    {
                        "Implementation": r.impl,
                        "Config": d.config_text(r.config) or None,
                        "Dtype": r.dtype,
                        "Device": r.device,
                        "N": r.seq_len,
                        "Rel. Error": r.rel_err,
                        "Tolerance": r.tolerance,
                        "Result": r.status,
                    }
                    for r in verify
                ],
                {"Rel. Error": lambda v: f"{v:.1e}", "Tolerance": lambda v: f"{v:.0e}"},
            )
        )


register(Section(90, "Environment and commands (appendix)", render))
