"""A multi-process job's processes die with their parent, whatever moment it dies: the torchrun
agent with attnbench, each rank with the agent. Standard library only, so that a rank arms
this before it imports anything heavy (torch takes seconds to import).

A process gets the parent-death signal (``die_with_parent``) only once it asks for it, and a
parent that died before that leaves it to init. torchrun starts every rank in a session of its
own, so nothing else reaches a rank its agent left behind. So the agent runs here
(``python -m attnbench.runtime.agent agent torch.distributed.run ARGS``): it puts its pid in the
environment its ranks inherit (``AGENT_PID``) and runs torchrun's own entry point; each rank
runs here too (``python -m attnbench.runtime.agent rank MODULE ARGS``): its first act asks for
the signal, its second compares its parent with ``AGENT_PID`` and leaves at once where they
differ (the agent died first), and only then does it import ``MODULE`` and run its ``main``.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys

# The pid of the process a rank must die with: the torchrun agent, or attnbench for one rank.
AGENT_PID = "ATTNBENCH_AGENT_PID"


def die_with_parent() -> None:
    """Linux sends SIGKILL when the parent dies, however it dies."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def die_with_agent() -> None:
    """In a rank, before anything else: the parent-death signal, and an exit where the agent
    (``AGENT_PID``) is no longer this process's parent, having died before it was armed."""
    die_with_parent()
    agent = os.environ.get(AGENT_PID, "")
    if agent.isdigit() and os.getppid() != int(agent):
        os._exit(1)


def run_agent(module: str, args: list[str]) -> None:
    """The agent: its ranks learn its pid, then ``module`` (torchrun) runs as ``python -m`` would."""
    os.environ[AGENT_PID] = str(os.getpid())
    sys.argv = [module, *args]
    importlib.import_module(module).main()


def run_rank(module: str, args: list[str]) -> None:
    die_with_agent()
    importlib.import_module(module).main(*args)


def command(role: str, module: str, *args: str) -> list[str]:
    """The arguments after ``python`` that run ``module`` as an agent or a rank here."""
    return ["-m", "attnbench.runtime.agent", role, module, *args]


if __name__ == "__main__":
    role, module, *rest = sys.argv[1:]
    (run_rank if role == "rank" else run_agent)(module, rest)
