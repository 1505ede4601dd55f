"""A run over several nodes: node 0 runs the command, every other node runs node 0's
multi-process trials with it, and a node that goes away fails the trial instead of hanging it.

Node 0's attnbench serves a store (torch's ``TCPStore``) at the rendezvous endpoint for the
whole run; each node's attnbench connects to it, and so does each node's torchrun agent, whose
c10d rendezvous keeps its state there under the trial's own id (no agent hosts a store of its
own). Through it:

- the nodes meet before the first trial (``Leader.meet``, ``Follower.meet``): each other node
  claims its rank and says it is ready; node 0 gives up after ``MEET_S``;
- node 0 posts each multi-process trial as a job (the function and payload every rank runs,
  the total ranks, the limits); every node starts its torchrun for it with the trial's
  rendezvous id, runs its ranks, and posts its part: what each of its ranks left (results,
  signals), and how its torchrun ended. Node 0 gathers the parts, so every rank's result
  reaches it, wherever the rank ran; it writes every row. The others write nothing;
- every node beats (``BEAT_S``) and watches: node 0 watches every other node, the others node
  0. A node whose beat stops for ``LOST_AFTER_S``, that says it left, or whose store stops
  answering is lost; so is the trial under way, at once on every node: node 0 posts the
  trial's abort and each node ends its torchrun. A node whose ranks failed ends the trial the
  same way (a rank on another node could otherwise wait in a collective until its timeout).
  Node 0 records a lost node's ranks as killed, naming the node, and fails every later
  multi-process trial at once; a node that loses node 0 stops with that message.

Keys, under ``attnbench/``: ``run``, ``claim/R``, ``ready/R``, ``go``, ``beat/R``, ``gone/R``,
``lost/R``, ``job/T``, ``result/T/R``, ``abort/T``, ``outcome/T``, ``end``, ``bye/R``
(R a node rank, T a trial's number in the run).
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from torch.distributed import DistError, TCPStore

from attnbench.errors import AttnbenchError
from attnbench.results.convert import to_json
from attnbench.results.schema import received
from attnbench.runtime import distributed
from attnbench.runtime.jobs import Ended, JobFile, RankEnded
from attnbench.runtime.nodes import (
    BEAT_S,
    GOODBYE_S,
    LOST_AFTER_S,
    MEET_S,
    Nodes,
    rendezvous_id,
    torchrun_args,
)

Say = Callable[[str], None]
POLL_S = 0.2


class NodeLost(Exception):
    """Node 0 went away (or gave this node up): this node's part of the run is over."""


def key(name: str) -> str:
    return f"attnbench/{name}"


def _connect(nodes: Nodes, timeout_s: float) -> TCPStore:
    return TCPStore(nodes.host, nodes.port, is_master=False, timeout=dt.timedelta(seconds=timeout_s))


def _put(store: TCPStore, name: str, value: Any) -> None:
    """Post ``value`` (a message below, or a plain string or flag) under ``name``."""
    store.set(key(name), json.dumps(to_json(value, nulls=True), default=str))


def _has(store: TCPStore, name: str) -> bool:
    return store.check([key(name)])


def _take(store: TCPStore, name: str, message: type | None = None) -> Any:
    """What was posted under ``name``: a ``message`` read back checked, or the plain value."""
    value = json.loads(store.get(key(name)))
    return received(message, value, name) if message else value


# --- the messages nodes post in the run's store -------------------------------------------------


@dataclass(frozen=True)
class RunStart:
    """Node 0's run, for the others to join: its name and how many nodes it spans."""

    run: str
    count: int


@dataclass(frozen=True)
class Ready:
    """A node joined (its host name), or refused the run (why)."""

    host: str | None = None
    refused: str | None = None


@dataclass(frozen=True)
class NodeJob:
    """One multi-process trial, as every node runs its share of its ranks."""

    id: str  # its rendezvous id
    sent: JobFile
    world: int  # ranks over all nodes
    phase_limit_s: float
    memory_limit: int | None


@dataclass(frozen=True)
class RunEnd:
    """Node 0 ended the run: its exit code, and why where it failed."""

    code: int
    why: str | None = None


class Pulse:
    """This node's heartbeat in the run's store and what it hears of the others, in a thread of
    its own with its own connection: which nodes are lost, and why the trial under way must end."""

    def __init__(self, nodes: Nodes, store: TCPStore) -> None:
        self.nodes, self.store = nodes, store
        # node 0 watches every other node; the others watch node 0
        self.watched = [r for r in range(1, nodes.count)] if nodes.leads else [0]
        self.lost: dict[int, str] = {}
        self.trial: int | None = None  # the multi-process trial under way
        self.abort: str | None = None  # why it must end
        self._seen = {r: (-1, time.monotonic()) for r in self.watched}
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def begin(self, trial: int) -> None:
        self.trial, self.abort = trial, None

    def stop_reason(self) -> str | None:
        """Why this node's part of the trial under way must end now, or None."""
        if self.lost:
            return "; ".join(f"node {r} was lost: {why}" for r, why in sorted(self.lost.items()))
        return self.abort

    def halt(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._halt.wait(BEAT_S):
            try:
                self.store.add(key(f"beat/{self.nodes.rank}"), 1)
                self._listen()
            except Exception as exc:  # the store is node 0's: it is gone, or this node is cut off
                if not self.nodes.leads:
                    self.lost.setdefault(
                        0, f"its store at {self.nodes.endpoint} stopped answering ({_first_line(exc)})"
                    )
                    return

    def _listen(self) -> None:
        now = time.monotonic()
        for r in self.watched:
            if r in self.lost:
                continue
            if _has(self.store, f"gone/{r}"):
                self.lost[r] = f"it left the run: {_take(self.store, f'gone/{r}')}"
                continue
            beats = self.store.add(key(f"beat/{r}"), 0)
            last, since = self._seen[r]
            if beats != last:
                self._seen[r] = (beats, now)
            elif now - since > LOST_AFTER_S:
                self.lost[r] = f"no heartbeat for {LOST_AFTER_S:g} s (its attnbench or its machine is gone)"
        if not self.nodes.leads and _has(self.store, f"lost/{self.nodes.rank}"):
            self.lost.setdefault(0, f"node 0 gave this node up: {_take(self.store, f'lost/{self.nodes.rank}')}")
        trial = self.trial
        if trial is not None and self.abort is None:
            self.abort = self._trial_failure(trial)

    def _trial_failure(self, trial: int) -> str | None:
        if not self.nodes.leads:
            return _take(self.store, f"abort/{trial}") if _has(self.store, f"abort/{trial}") else None
        for r in self.watched:
            if _has(self.store, f"result/{trial}/{r}"):
                why = part_failure(_take_part(self.store, trial, r))
                if why:
                    return f"node {r}: {why}"
        return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


# --- one trial's parts ------------------------------------------------------------------------


@dataclass
class NodePart:
    """What one node's ranks of a trial left: how each ended (its result still JSON, read once
    on node 0), the ranks it was to run, and how its torchrun ended."""

    node: int
    ranks: list[RankEnded]
    expected: int
    outcome: Ended


def _take_part(store: TCPStore, trial: int, node: int) -> NodePart:
    return received(NodePart, _take(store, f"result/{trial}/{node}"), f"node {node}")


def node_part(nodes: Nodes, job: NodeJob, pulse: Pulse) -> NodePart:
    """This node's ranks of a trial under torchrun joined to the trial's rendezvous: what each
    rank left (a failed one's message names this node) and how the launcher ended."""
    found, outcome = distributed.run_on_node(
        job.sent,
        job.world,
        job.phase_limit_s,
        job.memory_limit,
        rdzv=torchrun_args(nodes, job.world, job.id),
        stop=pulse.stop_reason,
    )
    ranks = [
        r if r.status == "ok" else replace(r, message=f"on node {nodes.rank}: {r.message}") for r in found.values()
    ]
    return NodePart(nodes.rank, ranks, job.world // nodes.count, outcome)


def part_failure(part: NodePart) -> str | None:
    """Why a node's part failed the trial (a rank failed, or ranks left nothing), or None."""
    failed = [r for r in part.ranks if r.status != "ok"]
    if failed:
        first = failed[0]
        return f"rank {first.rank} {first.status}: {first.message}"
    if len(part.ranks) < part.expected:
        return part.outcome.message or "its ranks left no result"
    return None


def combine_parts(parts: dict[int, NodePart], world: int, lost: dict[int, str]) -> list[RankEnded]:
    """How each rank ended, in rank order, from the nodes' parts. A rank no part holds ran on a
    lost node (it is killed, and the node is named as the cause), or on a node whose launcher
    failed or was stopped (its account is the rank's)."""
    found: dict[int, RankEnded] = {}
    for node in sorted(parts):
        for r in parts[node].ranks:
            found.setdefault(r.rank, r)
    if lost:
        why = "; ".join(f"node {n} was lost: {reason}" for n, reason in sorted(lost.items()))
        missing = RankEnded(-1, "killed", why, outcome=distributed.NODE_LOST)
    else:
        # the nodes short of ranks tell why; one stopped because of another node says so, so the
        # other's account comes first
        short = [(n, p.outcome) for n, p in sorted(parts.items()) if len(p.ranks) < p.expected]
        short.sort(key=lambda item: item[1].stopped)
        node, outcome = short[0] if short else (0, None)
        why = f"on node {node}: {(outcome and outcome.message) or 'stopped before writing a result'}"
        missing = RankEnded(-1, "killed", why, outcome=outcome and outcome.status)
    return [found.get(rank) or replace(missing, rank=rank) for rank in range(world)]


# --- node 0 -------------------------------------------------------------------------------------


class Leader:
    """Node 0: serves the run's store, meets the other nodes, spreads each multi-process trial
    over them (``distributed.launch`` hands it every one while it leads) and ends the run."""

    def __init__(self, nodes: Nodes, label: str, say: Say) -> None:
        self.nodes, self.say = nodes, say
        self.run = f"{label}-{uuid.uuid4().hex[:8]}"
        self.trials = 0
        self.hosts: list[str] = [socket.gethostname()]
        self.store = TCPStore(
            nodes.host, nodes.port, is_master=True, wait_for_workers=False, timeout=dt.timedelta(seconds=MEET_S)
        )
        self.pulse: Pulse | None = None

    def meet(self) -> None:
        """Wait until every other node is ready (``MEET_S`` at most); then trials may run."""
        _put(self.store, "run", RunStart(self.run, self.nodes.count))
        self.pulse = Pulse(self.nodes, _connect(self.nodes, LOST_AFTER_S))
        others = range(1, self.nodes.count)
        deadline = time.monotonic() + MEET_S
        waiting = list(others)
        while waiting:
            for r in list(waiting):
                if _has(self.store, f"ready/{r}"):
                    ready = _take(self.store, f"ready/{r}", Ready)
                    if ready.refused:
                        raise AttnbenchError(f"node {r} refused the run: {ready.refused}")
                    waiting.remove(r)
            if waiting and time.monotonic() > deadline:
                raise AttnbenchError(
                    f"node{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} did not reach node 0 at "
                    f"{self.nodes.endpoint} within {MEET_S:g} s: start the same command on every node "
                    f"(under SLURM: srun --ntasks-per-node=1), each with its own --node-rank"
                )
            time.sleep(POLL_S)
        self.hosts += [_take(self.store, f"ready/{r}", Ready).host for r in others]
        _put(self.store, "go", True)
        distributed.across_nodes = self.launch
        self.say(f"{self.nodes.count} nodes met at {self.nodes.endpoint} (run {self.run}): {', '.join(self.hosts)}")

    def launch(self, sent: JobFile, world: int, phase_limit_s: float, memory_limit: int | None) -> list[RankEnded]:
        """One multi-process trial over every node (``sent``: the job file every rank reads):
        how each rank ended, in rank order."""
        pulse = self.pulse
        if world % self.nodes.count:  # refused with the options; a job that still asks cannot run
            message = f"{world} ranks do not spread evenly over {self.nodes.count} nodes"
            return [RankEnded(r, "error", message) for r in range(world)]
        if pulse.lost:  # a node lost earlier: this trial cannot run
            return combine_parts({}, world, pulse.lost)
        self.trials += 1
        trial = self.trials
        job = NodeJob(rendezvous_id(self.run, trial), sent, world, phase_limit_s, memory_limit)
        pulse.begin(trial)
        _put(self.store, f"job/{trial}", job)
        parts = {0: node_part(self.nodes, job, pulse)}
        if part_failure(parts[0]) or pulse.abort or pulse.lost:
            _put(self.store, f"abort/{trial}", pulse.stop_reason() or f"node 0: {part_failure(parts[0])}")
        lost = self._gather(trial, parts)
        if lost and not _has(self.store, f"abort/{trial}"):
            _put(self.store, f"abort/{trial}", pulse.stop_reason())
        results = combine_parts(parts, world, lost)
        status, message = distributed.agreed_status(results)
        _put(self.store, f"outcome/{trial}", Ended(status, message))
        pulse.trial = None
        return results

    def _gather(self, trial: int, parts: dict[int, NodePart]) -> dict[int, str]:
        """Every other node's part of the trial, or the reason it is lost (each is one or the other)."""
        pulse = self.pulse
        waiting = set(range(1, self.nodes.count))
        while waiting:
            for r in sorted(waiting):
                if _has(self.store, f"result/{trial}/{r}"):
                    parts[r] = _take_part(self.store, trial, r)
                    waiting.discard(r)
                elif r in pulse.lost:
                    waiting.discard(r)
            time.sleep(POLL_S if waiting else 0)
        lost = {r: why for r, why in pulse.lost.items() if r not in parts}
        for r, why in lost.items():
            _put(self.store, f"lost/{r}", why)
        return lost

    def end(self, code: int, why: str | None = None) -> None:
        """Tell every node the run ended (with node 0's exit code, and why where it failed) and
        wait a little for each to hear it."""
        try:
            _put(self.store, "end", RunEnd(code, why))
            deadline = time.monotonic() + GOODBYE_S
            lost = self.pulse.lost if self.pulse else {}
            while time.monotonic() < deadline and any(
                not _has(self.store, f"bye/{r}") and r not in lost for r in range(1, self.nodes.count)
            ):
                time.sleep(POLL_S)
        finally:
            distributed.across_nodes = None
            if self.pulse:
                self.pulse.halt()
            self.store = self.pulse = None  # the last reference: the store stops serving


# --- every other node ---------------------------------------------------------------------------


class Follower:
    """A node other than 0: runs each multi-process trial node 0 posts until node 0 ends the run."""

    def __init__(self, nodes: Nodes, say: Say) -> None:
        self.nodes, self.say = nodes, say
        try:
            self.store = _connect(nodes, MEET_S)
        except Exception:
            raise AttnbenchError(
                f"node {nodes.rank} could not reach node 0 at {nodes.endpoint} within {MEET_S:g} s: start the same "
                "command on node 0, with the endpoint naming node 0"
            ) from None
        self.store.set_timeout(dt.timedelta(seconds=LOST_AFTER_S))
        if self.store.add(key(f"claim/{nodes.rank}"), 1) > 1:
            raise AttnbenchError(
                f"node rank {nodes.rank} is taken by another attnbench: give each node its own --node-rank"
            )
        self.pulse: Pulse | None = None

    def meet(self) -> None:
        """Join node 0's run (refused where the node counts differ); wait for it to begin."""
        r = self.nodes.rank
        run = self._wait("run", RunStart)
        if run.count != self.nodes.count:
            why = f"node {r} was started with {self.nodes.count} nodes, node 0 with {run.count}"
            _put(self.store, f"ready/{r}", Ready(refused=why))
            raise AttnbenchError(f"{why}: give every node the same --nnodes")
        self.pulse = Pulse(self.nodes, _connect(self.nodes, LOST_AFTER_S))
        _put(self.store, f"ready/{r}", Ready(host=socket.gethostname()))
        if self._wait_any("go", "end") == "end":
            _put(self.store, f"bye/{r}", True)
            why = _take(self.store, "end", RunEnd).why
            raise NodeLost(f"node 0 ended the run before it began{f': {why}' if why else ''}")
        self.say(f"node {r} of {self.nodes.count}: joined run {run.run} at {self.nodes.endpoint}")

    def follow(self) -> int:
        """Node 0's trials, one by one, until it ends the run: its exit code."""
        try:
            return self._follow()
        except DistError as exc:  # the store is node 0's
            raise NodeLost(f"node 0 was lost: its store stopped answering ({_first_line(exc)})") from None
        except BaseException as exc:  # interrupted, or failed here: node 0 hears it at once
            if not isinstance(exc, NodeLost):
                try:
                    _put(self.store, f"gone/{self.nodes.rank}", _first_line(exc) if str(exc) else type(exc).__name__)
                except DistError:
                    pass
            raise
        finally:
            if self.pulse:
                self.pulse.halt()

    def _follow(self) -> int:
        r = self.nodes.rank
        self.meet()
        trial = 1
        while self._wait_any(f"job/{trial}", "end") != "end":
            job = _take(self.store, f"job/{trial}", NodeJob)
            self.say(f"trial {job.id}: {job.world // self.nodes.count} of its {job.world} ranks here")
            self.pulse.begin(trial)
            part = node_part(self.nodes, job, self.pulse)
            _put(self.store, f"result/{trial}/{r}", part)
            if self._wait_any(f"outcome/{trial}", "end") == "end":
                break
            outcome = _take(self.store, f"outcome/{trial}", Ended)
            said = f": {outcome.message}" if outcome.message else ""
            self.say(f"trial {job.id}: {outcome.status}{said}")
            self.pulse.trial = None
            trial += 1
        end = _take(self.store, "end", RunEnd)
        _put(self.store, f"bye/{r}", True)
        if end.why:
            self.say(f"node 0 ended the run: {end.why}")
        return end.code

    def _wait(self, name: str, message: type) -> Any:
        self._wait_any(name)
        return _take(self.store, name, message)

    def _wait_any(self, *names: str) -> str:
        """The first of ``names`` node 0 posts; ``NodeLost`` if node 0 is lost first."""
        deadline = time.monotonic() + MEET_S
        while True:
            for name in names:
                if _has(self.store, name):
                    return name
            lost = self.pulse.lost.get(0) if self.pulse else None
            if lost:
                raise NodeLost(f"node 0 was lost: {lost}")
            if self.pulse is None and time.monotonic() > deadline:  # before the beats start
                raise NodeLost(f"node 0 did not start the run within {MEET_S:g} s")
            time.sleep(POLL_S)
