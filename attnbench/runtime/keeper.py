"""The process-group keeper: ends every child's process group when attnbench ends, however it
ends (a SIGKILL included).

A child's own processes (helpers an outside implementation starts, a torchrun agent's ranks)
share its process group. The parent ends that group when the child ends, but a parent killed
with SIGKILL ends nothing, and the parent-death signal reaches only its direct children. So
the parent starts this small process once (``python -m attnbench.runtime.keeper``, standard
library only) and tells it, one line each on its stdin, ``+PGID`` for every group it starts
and ``-PGID`` for every group it has ended. The keeper holds the only other end of that pipe:
when attnbench exits or is killed, the keeper reads end-of-file and SIGKILLs every group still
on its list. It runs in a session of its own, so a Ctrl-C at the terminal reaches attnbench,
which ends its children itself, and not the keeper.
"""

from __future__ import annotations

import os
import signal
import sys


def keep(lines) -> set[int]:
    """Follow ``+PGID`` / ``-PGID`` lines until end-of-file; the groups still kept."""
    groups: set[int] = set()
    for line in lines:
        sign, pgid = line[:1], line[1:].strip()
        if pgid.isdigit():
            (groups.add if sign == "+" else groups.discard)(int(pgid))
    return groups


def end_groups(groups: set[int]) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only end-of-file ends the keeper's watch
    end_groups(keep(sys.stdin))
