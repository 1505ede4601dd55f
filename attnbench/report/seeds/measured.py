"""What the rows of one machine measure of a seed claim (``seeds.claims``): the quantity with
its 95% interval and n, from the newest matching row (``pick = "best"``: the largest over the
matching rows, for a claim about the best case), or the ratio of two such quantities.

Each measurement also carries what its rows say about how it was measured (the device, the
ranks, the allocator limit, the share of a shard's keys and values a sequence-parallel row sent,
the host's share of the one-GPU calls a speed ratio rests on, whether the value is a fit's
prediction or a lower bound, whether its only cases are anomalies), so the verdict rule
(``seeds.verdicts``) can tell whether it is on the seed's terms from the rows alone, whichever
directory they came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from attnbench.report import data as d
from attnbench.report.fit import fit_miss_cause
from attnbench.report.intervals import time_interval
from attnbench.report.sections.data_parallel import speedup_anomalies
from attnbench.report.seeds.claims import BYTES, HARDWARE_BOUND, Claim, matches, short_label
from attnbench.report.tables.sweep import MaxSeqSummary
from attnbench.results.schema import Row, Trial
from attnbench.results.series import row_date
from attnbench.trials.workload import Workload
from attnbench.units import format_gib

EXACT_STOPS = ("memory", "host memory")  # a search stopped otherwise (time, its cap) only bounds the length
TRAINING = {"mode": "fwd_bwd", "module": "multihead"}  # a training step of the multi-head module: what DDP trains
FORWARD = {"mode": "fwd"}  # every other claim: the seeds timed and measured forward calls
RING_SHARE = 0.10  # a ring settles a claim only where it sent at least this share of a shard's K/V per call
HOST_SHARE = 0.10  # a speed ratio's size is judged only where its one-GPU calls' host share is under this


@dataclass
class Measured:
    value: float
    low: float | None
    high: float | None
    n: str
    machine: str
    workload: str
    date: str
    notes: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # FILE:LINE of the rows behind it
    device: str = "cuda"  # where its rows ran: cuda or cpu
    ranks: int = 1  # GPUs or processes the widest row behind it spread over
    limit: int | None = None  # the allocator limit its rows ran under; None: the whole device
    moved: list[float | None] = field(default_factory=list)  # per sequence-parallel row: its K/V share sent
    hosts: list[float | None] = field(default_factory=list)  # per one-GPU call of a speed ratio: its host share
    floor: float | None = None  # the memory floor (q, k, v, output) of what a memory value holds
    fitted: bool = False  # a fit's prediction, not a measurement
    bound: bool = False  # a lower bound: the search stopped by time or its cap, not by memory
    anomaly: str = ""  # why the cases behind it are anomalies (the speedup tables' rule), where they are

    @property
    def hardware(self) -> str:
        """Where it was measured, in a few words: 'NVIDIA H200 x1 under an allocator limit of
        8 GiB', 'a CPU (AMD EPYC), 2 processes over gloo'."""
        if self.device == "cpu":
            name = self.machine.removeprefix("cpu: ")
            text = f"a CPU ({name})" + (f", {self.ranks} processes over gloo" if self.ranks > 1 else "")
        else:
            text = self.machine
        return text + (f" under an allocator limit of {format_gib(self.limit)}" if self.limit else "")


def _measured(
    m, row: Row, rows: list[Any], value: float, n: str, low: float | None = None, high: float | None = None, **more: Any
) -> Measured:
    """What ``m``'s ``row`` measures, with how the ``rows`` behind it were measured."""
    rows = [r for r in rows if r is not None]
    return Measured(
        value,
        low,
        high,
        n,
        m.name,
        short_label(row),
        row_date(row),
        device="cpu" if any(r.device == "cpu" for r in rows) else "cuda",
        ranks=max((d.world_size(r) for r in rows), default=1),
        limit=next((r.memory_limit for r in rows if getattr(r, "memory_limit", None)), None),
        moved=[kv_share(r) for r in rows if _sequence_parallel(r)],
        sources=[r.source for r in rows if r.source],
        **more,
    )


def _sequence_parallel(row: Row) -> bool:
    """One sequence split over several ranks: what its ring sent is part of what it measured."""
    return isinstance(row, Trial) and d.world_size(row) > 1


def _workload(row: Row, batch: int | None = None, seq_len: int | None = None) -> Workload:
    return Workload(
        impl=row.impl,
        batch=int(row.batch or 1) if batch is None else batch,
        seq_len=row.seq_len if seq_len is None else seq_len,
        heads=row.heads,
        head_dim=row.head_dim,
        dtype=row.dtype,
        mode=row.mode or "fwd",
        kv_heads=getattr(row, "kv_heads", None),
    )


def kv_share(row: Trial) -> float | None:
    """The bytes a sequence-parallel row's busiest rank sent per call over one shard's keys and
    values (1: each rank passed its own K/V on once); None where the row does not record them."""
    if row.sent_bytes is None:
        return None
    shard = 2 * _workload(row).kv_tensor_bytes / d.world_size(row)
    return row.sent_bytes / shard


def replicas(row: Row) -> int:
    """The replicas a DataParallel row ran: the GPUs that got part of the batch."""
    given = getattr(row, "replica_batches", None)
    if given:
        return sum(1 for _, b in given if b)
    return min(int(row.batch or 1), d.world_size(row))


def _floor(metric: str, row: Row) -> float | None:
    """The memory floor of what ``metric`` reads of ``row``: q, k, v and the output (and their
    gradients in training) of the tokens that memory holds: the call's, one rank's shard, one
    DataParallel replica's batch."""
    if metric == "peak_bytes":
        return getattr(row, "floor_bytes", None) or _workload(row).floor_bytes
    if metric == "peak_per_gpu":
        return _workload(row, seq_len=row.seq_len // d.world_size(row)).floor_bytes
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        gpu = int(metric[3])
        given = getattr(row, "replica_batches", None) or [[0, int(row.batch or 1)]]
        batch = sum(b for g, b in given if g == gpu)
        return _workload(row, batch=batch).floor_bytes if batch else None
    return None


def _chosen(rows: list[Any], value, pick: str) -> tuple[Any, int]:
    """The newest row (or the one of largest value) and how many others matched."""
    if not rows:
        return None, 0
    if pick == "best":
        return max(rows, key=lambda r: (value(r), row_date(_row(r)))), len(rows) - 1
    return max(rows, key=lambda r: row_date(_row(r))), len(rows) - 1


def _row(item: Any) -> Row:
    """The row an item stands for: a speedup case's row, a search's first trial, or the row itself."""
    return getattr(item, "row", None) or getattr(item, "head", item)


def _speedup(claim: Claim, m, match, per_gpu: bool) -> Measured | None:
    """A speedup case's speedup (or efficiency): never one the speedup tables flag as an anomaly
    where another matches; "at best", the best of the compute-bound cases where one is."""
    cases = [c for c in m.speedups if c.speedup and matches(c.row, match) and _replicas_agree(claim, c.row)]
    sound = [c for c in cases if not speedup_anomalies(c)]
    pool = sound or cases
    if claim.pick == "best":
        pool = [c for c in pool if compute_bound([host_share(c.single)])] or pool
    c, others = _chosen(pool, lambda c: c.efficiency if per_gpu else c.speedup, claim.pick)
    if c is None:
        return None
    iv = c.efficiency_ci if per_gpu else c.speedup_ci
    row = c.row
    spread = (iv.low, iv.high) if iv.n > 1 else (None, None)
    out = _measured(m, row, [c.single, row], iv.value, f"{_n(c.single)}/{_n(row)}", *spread)
    out.hosts = [host_share(c.single)]
    out.anomaly = "; ".join(speedup_anomalies(c))
    out.notes += replica_notes(row)
    if others:
        out.notes.append(f"the {'best' if claim.pick == 'best' else 'newest'} of {others + 1} matching cases")
    return out


def host_share(row: Row | None) -> float | None:
    """The host's share of a one-GPU call (1 - GPU time / eager time); None where not recorded."""
    return getattr(row, "dispatch_share", None)


def compute_bound(hosts: list[float | None]) -> bool:
    """Every one-GPU call behind a speed ratio spends less than ``HOST_SHARE`` of its time on the
    host: the GPU's work dominates, as it did in the seeds' calls of tens of milliseconds."""
    return bool(hosts) and all(h is not None and h < HOST_SHARE for h in hosts)


def _replicas_agree(claim: Claim, row: Row) -> bool:
    """A DataParallel row runs as many replicas as the seed's own numbers show its run had."""
    return claim.replicas is None or getattr(row, "strategy", None) != "dp" or replicas(row) == claim.replicas


def _n(row: Row | None) -> int:
    iv = time_interval(row) if row is not None else None
    return iv.n if iv else 1


def _row_value(metric: str, row: Row) -> float | None:
    get = lambda name: getattr(row, name, None)  # noqa: E731 (a speedup row lacks some trial fields)
    if metric == "time_ms":
        return get("time_ms")
    if metric == "tokens_per_s":
        return get("tokens_per_s") or (d.tokens(row) / (row.time_ms / 1e3) if get("time_ms") else None)
    if metric == "peak_per_gpu":
        return d.peak_per_gpu(row)
    if metric in ("added_bytes", "added_per_token"):
        peak, inputs = get("peak_bytes"), get("inputs_bytes")
        if peak is None or inputs is None:
            return None
        return (peak - inputs) / (d.tokens(row) if metric == "added_per_token" else 1)
    if metric == "bytes_per_token":
        peak = d.peak_per_gpu(row)
        return peak / (d.tokens(row) / d.world_size(row)) if peak else None
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        gpus = d.gpus(row)
        i = int(metric[3])
        return gpus[i].max_memory_allocated if len(gpus) > i else None
    return get(metric)


def _row_metric(claim: Claim, m, metric: str, match: dict[str, Any]) -> Measured | None:
    pick = claim.pick
    rows = [
        r
        for r, ident in m.ran_of(match.get("impl"), match.get("seq_len"))
        if matches(r, match, ident) and _row_value(metric, r) is not None and _replicas_agree(claim, r)
    ]
    row, others = _chosen(rows, lambda r: _row_value(metric, r), pick)
    if row is None:
        return None
    value = _row_value(metric, row)
    low = high = None
    iv = time_interval(row)
    timed = metric in HARDWARE_BOUND and iv is not None and iv.n > 1
    if timed and metric == "time_ms":
        low, high = iv.low, iv.high
    elif timed:  # a rate: the bounds swap
        low, high = value * row.time_ms / iv.high, value * row.time_ms / iv.low
    out = _measured(m, row, [row], value, str(iv.n if timed else 1), low=low, high=high)
    if metric in HARDWARE_BOUND and d.world_size(row) == 1:
        out.hosts = [host_share(row)]
    if metric in BYTES:
        out.floor = _floor(metric, row)
    if metric in ("gpu0_bytes", "gpu1_bytes"):
        out.notes += replica_notes(row)
    if others and pick == "newest":
        out.notes.append(f"the newest of {others + 1} matching rows")
    return out


def _max_seq(m, match: dict[str, Any], pick: str, limit: int | None = None) -> Measured | None:
    """The longest sequence of the matching workload's max-seq searches. Under an allocator
    ``limit`` (8 GiB: the seeds' GPU; 24 GiB: a projection onto an RTX 3090), a search under that
    limit; else the longest a search under a smaller limit ran, a lower bound (what fits in 8 GiB
    fits in 24); where none ran, the series' memory fit solved for it (the allocator's share, with
    what this device sets aside for the CUDA context), marked as the prediction it is."""
    found = [s for s in m.summaries if s.max_seq_len and matches(s.head, match)]
    exact = [s for s in found if limit is None or s.head.memory_limit == limit]
    if exact:
        return _search_answer(m, _chosen(exact, lambda s: s.max_seq_len, pick)[0])
    below = [s for s in found if limit and s.head.memory_limit and s.head.memory_limit < limit]
    if below:
        best = max(below, key=lambda s: (s.max_seq_len, row_date(s.head)))
        out = _search_answer(m, best)
        out.bound = True
        out.notes.append(
            f"what fits in {format_gib(best.head.memory_limit)} fits in {format_gib(limit)}: a lower bound"
        )
        return out
    fitted = [c for c in m.capacities if limit and c.fit and matches(c.head, match) and c.predict_for(limit)]
    if not fitted:
        return None
    c = max(fitted, key=lambda c: (c.successful, row_date(c.head)))
    fit = f"the {'quadratic' if c.fit.degree == 2 else 'linear'} fit of {c.successful} trials"
    notes = [f"{fit} solved for {format_gib(limit)}"]
    if c.error is not None and abs(c.error) > 0.05:
        notes.append(f"it misses this GPU's measured maximum by {c.error * 100:+.0f}% ({fit_miss_cause(c)})")
    return _measured(m, c.head, [c.head], c.predict_for(limit), f"{c.successful} trials", notes=notes, fitted=True)


def _search_answer(m, s: MaxSeqSummary) -> Measured:
    """A search's longest length, as one measured value: exact where memory stopped it, else
    (time, its cap, an interrupted search) a lower bound."""
    head, best = s.head, m.at_max(s)
    bound = s.stopped_by not in EXACT_STOPS
    where = f"a search under an allocator limit of {format_gib(head.memory_limit)}" if head.memory_limit else "a search"
    note = f"{where}, stopped by {s.stopped_by}" + (": a lower bound" if bound else "")
    return _measured(m, head, [head, best], s.max_seq_len, "1 search", notes=[note], bound=bound)


def measure_one(claim: Claim, m, match: dict[str, Any]) -> Measured | None:
    if claim.metric in ("speedup", "efficiency"):
        return _speedup(claim, m, match, claim.metric == "efficiency")
    if claim.metric in ("max_seq", "max_seq_8gb"):
        return _max_seq(m, match, claim.pick, claim.budget if claim.metric == "max_seq_8gb" else None)
    return _row_metric(claim, m, claim.metric, match)


def _top(claim: Claim, m, match: dict[str, Any]) -> tuple[Measured | None, dict[str, Any]]:
    """The claim's own rows, else those of its stand-in settings, said in a note; and the
    settings that stood in (empty where none did), which a ratio's other side takes too."""
    own = measure_one(claim, m, match)
    if not claim.stand_in or (own is not None and not own.fitted):
        return own, {}
    found = measure_one(claim, m, {**match, **claim.stand_in})  # a measured stand-in before a fit of the seed's own
    if found is None or (found.fitted and own is not None):
        return own, {}
    settings = ", ".join(f"{k} {v}" for k, v in claim.stand_in.items())
    found.notes.append(f"no row at the seed's settings: {settings} stands in")
    if claim.bound_stand_in:  # a heavier workload: what it holds, the seed's lighter one holds too
        found.bound = True
        found.notes.append("a heavier workload than the seed's, so what it holds bounds the seed's from below")
    return found, claim.stand_in


def measure(claim: Claim, m) -> Measured | None:
    """The claim's quantity on one machine: its metric, or the ratio ``match`` over ``over``,
    from GPU rows only (every seed ran on GPUs)."""
    on = {"device": "cuda", **(TRAINING if claim.training else FORWARD)}
    top, stood_in = _top(claim, m, {**on, **claim.match})
    if top is None or claim.over is None:
        return top
    over = {**on, **claim.over, **stood_in}
    if "seq_len" in claim.match and "seq_len" not in over:
        over["seq_len"] = claim.match["seq_len"]
    bottom = measure_one(claim, m, over)
    if bottom is None or not bottom.value or bottom.bound:  # over a lower bound a ratio bounds nothing
        return None
    return _ratio(top, bottom)


def _ratio(top: Measured, bottom: Measured) -> Measured:
    low = high = None
    if None not in (top.low, top.high, bottom.low, bottom.high) and bottom.low and bottom.high:
        low, high = top.low / bottom.high, top.high / bottom.low
    return Measured(
        top.value / bottom.value,
        low,
        high,
        f"{top.n}/{bottom.n}",
        top.machine,
        f"{top.workload} over {bottom.workload}",
        max(top.date, bottom.date),
        top.notes + [n for n in bottom.notes if n not in top.notes],
        top.sources + bottom.sources,
        device="cpu" if "cpu" in (top.device, bottom.device) else "cuda",
        ranks=max(top.ranks, bottom.ranks),
        limit=top.limit or bottom.limit,
        moved=top.moved + bottom.moved,
        hosts=top.hosts + bottom.hosts,
        fitted=top.fitted or bottom.fitted,
        bound=top.bound,
        anomaly=top.anomaly or bottom.anomaly,
    )


def replica_notes(row: Row) -> list[str]:
    """Why a data-parallel GPU sat idle: fewer batch elements than GPUs."""
    batch = int(getattr(row, "batch", 1) or 1)
    if getattr(row, "strategy", None) == "dp" and batch < d.world_size(row):
        idle = ", ".join(f"GPU {i}" for i in range(batch, d.world_size(row)))
        return [f"at batch {batch} DataParallel ran {batch} replica; {idle} held nothing"]
    return []
