"""`attnbench CMD --resume --out DIR` alone: the command DIR's rows recorded, continued.

Every row carries the command line that wrote it (``env.argv``; rows older than that field,
``env.command``). Typing only ``--resume --out DIR`` replays that command with this DIR, so an
interrupted run continues without retyping it; anything more on the line is taken as typed.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from attnbench.errors import AttnbenchError

RESUMABLE = ("max-seq", "bench", "run", "speedup")


def replayed_argv(argv: list[str]) -> list[str]:
    """``argv`` (without the program name), or the recorded command when it names only
    ``--resume`` and ``--out DIR`` of a resumable command (an error where DIR holds no row to
    resume)."""
    if not argv or argv[0] not in RESUMABLE:
        return argv
    out, rest = _take_out(argv[1:])
    if out is None or rest != ["--resume"]:
        return argv
    recorded = recorded_argv(Path(out))
    if recorded is None:  # nothing recorded: a mistyped DIR would otherwise start a whole new run
        raise AttnbenchError(
            f"nothing to resume in {out}: it holds no readable result row; check the directory, "
            f"or start a new run with the whole command (`attnbench {argv[0]} ... --out {out}`)"
        )
    if not recorded or recorded[0] != argv[0]:
        what = f"`attnbench {recorded[0]}`" if recorded else "a command attnbench cannot replay"
        raise AttnbenchError(
            f"{out} holds rows of {what}: resume it with the command that wrote them, "
            f"e.g. `attnbench {recorded[0] if recorded else 'CMD'} --resume --out {out}`"
        )
    _, options = _take_out([a for a in recorded[1:] if a != "--resume"])
    return [argv[0], *options, "--out", out, "--resume"]


def recorded_argv(out_dir: Path) -> list[str] | None:
    """The command (from the command's name on) that wrote the first row in ``out_dir``;
    None where it holds no readable row."""
    from attnbench.results import TRIALS_FILE, iter_rows

    if not (out_dir / TRIALS_FILE).is_file():
        return None
    # the first row that names its command: read no further (a history may hold a million rows)
    env = next((r["env"] for r in iter_rows(out_dir / TRIALS_FILE) if isinstance(r.get("env"), dict)), None)
    if env is None:
        return None
    if isinstance(env.get("argv"), list):
        return [str(a) for a in env["argv"]]
    words = shlex.split(str(env.get("command", "")))
    # the program (a console script, or attnbench/__main__.py under python -m) comes first
    return words[1:] if words else []


def _take_out(args: list[str]) -> tuple[str | None, list[str]]:
    """The value of ``--out`` (``--out DIR`` or ``--out=DIR``) and the other arguments."""
    out, rest, i = None, [], 0
    while i < len(args):
        if args[i] == "--out" and i + 1 < len(args):
            out, i = args[i + 1], i + 2
            continue
        if args[i].startswith("--out="):
            out = args[i].split("=", 1)[1]
        else:
            rest.append(args[i])
        i += 1
    return out, rest
