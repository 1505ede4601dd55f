"""Does a second GPU help? One implementation at (sequence length x batch) cases, on one GPU
and spread over P GPUs by each strategy (``attnbench.sweeps.strategies``), every trial in
fresh processes under ``attnbench.runtime.distributed.launch``, one row per (case, strategy).

Per case, ``single`` runs first and leaves its output in a scratch directory; every other
strategy's output is compared with it (relative L2 error within the dtype's tolerance, or
the row fails). Speedup and scaling efficiency are not stored: tables compute them from the
rows (``attnbench.report.speedup_tables``), matching each row to the single row of its run.

Over 400 lines on purpose: a run's settings and cases, how the ranks' results become its
rows, and the runner belong to one run and are read together; the rank side is
``attnbench.sweeps.speedup_job``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.reference import TOLERANCE, VerifyCase
from attnbench.results import ResultsLock, now_utc
from attnbench.sweeps import strategies
from attnbench.sweeps.session import Reporter as BaseReporter
from attnbench.sweeps.session import RunSession
from attnbench.sweeps.strategies import GRAD_COMPRESSION, MODULES, Strategy
from attnbench.units import parse_tokens
from attnbench.workload import Workload, check_workload_fields

SEED_CASES = "2048x8,4096x4,8192x2,16384x1"  # reports 000 and 001
KIND = "speedup"
# what makes two speedup rows the same trial (resume skips a trial it finds)
KEY_FIELDS = (
    "impl",
    "config",
    "batch",
    "seq_len",
    "heads",
    "head_dim",
    "dtype",
    "device",
    "mode",
    "causal",
    "strategy",
    "world_size",
    "module",
    "grad_compression",
)


@dataclass(frozen=True)
class Case:
    seq_len: int
    batch: int

    @property
    def label(self) -> str:
        return f"{self.seq_len}x{self.batch}"


def parse_cases(text: str) -> tuple[Case, ...]:
    """'2048x8,64Kx2' -> (Case(2048, 8), Case(65536, 2))."""
    cases = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        m = re.fullmatch(r"([0-9]+[kKmM]?)\s*[xX*]\s*([0-9]+)", part)
        if not m or int(m.group(2)) < 1 or parse_tokens(m.group(1)) < 1:
            raise AttnbenchError(f"cannot read case {part!r}: write SEQLENxBATCH, e.g. --cases 2048x8,4096x4 or 64Kx2")
        cases.append(Case(parse_tokens(m.group(1)), int(m.group(2))))
    if not cases:
        raise AttnbenchError("--cases is empty: give SEQLENxBATCH cases, e.g. --cases " + SEED_CASES)
    return tuple(dict.fromkeys(cases))


def parse_strategies(text: str) -> tuple[str, ...]:
    names = [n.strip() for n in str(text).split(",") if n.strip()]
    for n in names:
        strategies.get(n)
    return tuple(dict.fromkeys(n for n in names if n != "single"))


@dataclass(frozen=True)
class SpeedupSettings:
    impl: str
    config: dict[str, Any]
    cases: tuple[Case, ...]
    gpus: int = 2
    strategies: tuple[str, ...] = ("dp", "mp")
    module: str = "attention"
    grad_compression: str | None = None
    dtype: str = "bf16"
    device: str = "cuda"
    heads: int = 8
    head_dim: int = 64
    mode: str = "fwd"
    causal: bool = False
    max_trial_seconds: float = 60.0
    timing: dict[str, Any] = field(default_factory=dict)  # TimingPolicy fields

    def workload(self, case: Case) -> Workload:
        return Workload(
            impl=self.impl,
            config=self.config,
            batch=case.batch,
            seq_len=case.seq_len,
            heads=self.heads,
            head_dim=self.head_dim,
            dtype=self.dtype,
            device=self.device,
            mode=self.mode,
            causal=self.causal,
        )

    def order(self) -> tuple[str, ...]:
        return ("single", *self.strategies)


def check_settings(s: SpeedupSettings, cuda_devices: int, cases_given: bool = True) -> SpeedupSettings:
    """Every bad input, before anything runs or is written; returns the settings with the
    implementation's configuration filled in. A case a strategy cannot run (mp and batch 1) is
    bad input when the user named the cases; with the seeds' default cases that strategy
    records the case as skipped, with its reason, and the rest of the table still runs."""
    spec = impls.spec(s.impl)
    check_workload_fields(s.dtype, s.mode, s.device)
    if s.device not in spec.devices:
        raise AttnbenchError(f"{s.impl} does not run on {s.device}: it runs on {', '.join(spec.devices)}")
    if s.dtype not in spec.dtypes:
        raise AttnbenchError(f"{s.impl} does not run {s.dtype}: choose --dtype from {', '.join(spec.dtypes)}")
    for key in ("gpus", "heads", "head_dim"):
        if getattr(s, key) < 1:
            raise AttnbenchError(f"--{key.replace('_', '-')} must be at least 1")
    if not (math.isfinite(s.max_trial_seconds) and s.max_trial_seconds > 0):
        raise AttnbenchError("--max-trial-seconds must be a positive number of seconds")
    if s.device == "cpu" and s.gpus > (os.cpu_count() or 1):
        raise AttnbenchError(
            f"--gpus {s.gpus} on the CPU starts {s.gpus} processes but this machine has "
            f"{os.cpu_count()} cores: use --gpus {os.cpu_count() or 1} or fewer"
        )
    if s.device == "cuda" and s.gpus > cuda_devices:
        raise AttnbenchError(
            f"--gpus {s.gpus} but this machine has {cuda_devices} CUDA GPU{'s' if cuda_devices != 1 else ''}: "
            f"ask for at most {cuda_devices}"
        )
    if s.module not in MODULES:
        raise AttnbenchError(f"unknown module {s.module!r}: choose {' or '.join(MODULES)}")
    _check_compression(s)
    try:
        config = impls.normalize_config(s.impl, s.config)
        impl = impls.build(s.impl, **config)
        for case in s.cases:
            impl.check_shape(case.seq_len, s.heads)
    except ConfigError as exc:
        raise AttnbenchError(str(exc)) from None
    s = SpeedupSettings(**{**asdict(s), "config": impl.config(), "cases": s.cases})
    if cases_given:
        for name in s.strategies:
            for case in s.cases:
                strategies.get(name).check(s.workload(case), s.gpus)
    return s


def refusal(s: SpeedupSettings, case: Case, strategy: Strategy) -> str | None:
    """Why ``strategy`` cannot run ``case`` on this device, or None."""
    reason = strategy.skip(s.device)
    if reason:
        return reason
    try:
        strategy.check(s.workload(case), s.gpus)
    except AttnbenchError as exc:
        return str(exc)
    return None


def _check_compression(s: SpeedupSettings) -> None:
    if s.grad_compression is None:
        return
    if s.grad_compression not in GRAD_COMPRESSION:
        raise AttnbenchError(
            f"unknown --grad-compression {s.grad_compression!r}: choose {' or '.join(GRAD_COMPRESSION)}"
        )
    if s.module != "multihead" or s.mode != "fwd_bwd" or "mp" not in s.strategies:
        raise AttnbenchError(
            "--grad-compression compresses DistributedDataParallel's gradient all-reduce: "
            "use it with --module multihead --mode fwd_bwd --strategy mp"
        )
    if s.grad_compression == "bf16" and s.device != "cuda":
        raise AttnbenchError(
            "bf16 gradient compression needs CUDA and NCCL (torch's hook refuses gloo): "
            "use --grad-compression fp16 on the CPU"
        )


def trial_key(row: dict[str, Any]) -> str:
    blob = json.dumps({k: row.get(k) for k in KEY_FIELDS}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------
# Rank results -> one row
# ---------------------------------------------------------------------------------------


def slowest_per_iteration(per_rank: list[list[float]]) -> list[float]:
    """Iteration i of a data-parallel step ends when its slowest rank ends."""
    if not per_rank or any(len(t) != len(per_rank[0]) for t in per_rank):
        raise ValueError("ranks timed different numbers of iterations")
    return [max(column) for column in zip(*per_rank)]


def gpu_rows(
    count: int,
    nvml: list[dict[str, int]] | None,
    nvml_index: dict[str, int] | None,
    allocator: dict[str, dict[str, int]],
) -> list[dict[str, Any]]:
    """One row per GPU of the run (CUDA index): NVML used memory before and at peak, and
    the allocator peaks of the process that used it (None where none did)."""
    by_nvml = {g["index"]: g for g in nvml or []}
    rows = []
    for i in range(count):
        j = (nvml_index or {}).get(str(i), i)
        seen = by_nvml.get(j, {})
        alloc = allocator.get(str(i), {})
        rows.append(
            {
                "index": i,
                "nvml_index": j if nvml else None,
                "nvml_used_before": seen.get("nvml_used_before"),
                "nvml_used_peak": seen.get("nvml_used_peak"),
                "max_memory_allocated": alloc.get("max_memory_allocated"),
                "max_memory_reserved": alloc.get("max_memory_reserved"),
            }
        )
    return rows


def relative_error(parts: list[dict[str, Any] | None]) -> tuple[float | None, int]:
    """sqrt(sum of squared errors / sum of squared reference values) over the ranks' shares."""
    if not parts or any(p is None for p in parts):
        return None, 0
    err, ref = sum(p["sq_err"] for p in parts), sum(p["sq_ref"] for p in parts)
    if any(p.get("nonfinite") for p in parts) or not math.isfinite(err):
        return float("nan"), sum(p["elements"] for p in parts)
    return (math.sqrt(err / ref) if ref > 0 else math.sqrt(err)), sum(p["elements"] for p in parts)


def merge_ranks(results: list[dict[str, Any]], s: SpeedupSettings, case: Case, strategy: Strategy) -> dict[str, Any]:
    """The row fields of one trial from its ranks' results (pure: tests feed it by hand)."""
    from attnbench.measure.timing import summarize, time_intervals
    from attnbench.runtime.distributed import agreed_status

    status, message = agreed_status(results)
    row: dict[str, Any] = {"status": status, "message": message, "processes": len(results)}
    ok = status == "ok"
    row["times_ms"] = slowest_per_iteration([r["times_ms"] for r in results]) if ok else []
    row.update(summarize(row["times_ms"]))
    row["first_call_ms"] = max((r.get("first_call_ms") or 0 for r in results), default=None) or None
    if row["time_ms"]:
        row["tokens_per_s"] = case.batch * case.seq_len / (row["time_ms"] / 1e3)
    lead = results[0]
    allocator = {d: a for r in results for d, a in (r.get("allocator") or {}).items()}
    row["gpus"] = gpu_rows(s.gpus, lead.get("nvml"), lead.get("nvml_index"), allocator) if s.device == "cuda" else []
    row["ranks"] = [
        {k: r.get(k) for k in ("rank", "status", "devices", "cpu_peak_rss")}
        | {"first_call_ms": r.get("rank_first_call_ms"), "time_ms": summarize(r.get("times_ms") or [])["time_ms"]}
        for r in results
    ]
    row["backend"] = lead.get("backend")
    if ok and len(results) == 1 and lead.get("gpu_times_ms") is not None:
        row.update(gpu_times_ms=lead["gpu_times_ms"], gpu_timer=lead.get("gpu_timer"))
    row.update(time_intervals(row))
    for key in ("replica_batches", "nvml_note"):
        if lead.get(key) is not None:
            row[key] = lead[key]
    row.update(_output_check(results, s, case, strategy, ok))
    if row.get("output_match") is False:
        row.update(status="error", message=row["output_message"])
    return row


def _output_check(results, s: SpeedupSettings, case: Case, strategy: Strategy, ok: bool) -> dict[str, Any]:
    tol = TOLERANCE[s.dtype]
    out: dict[str, Any] = {"output_match": None, "output_rel_err": None, "tolerance": tol}
    if strategy.name == "single" or not ok:
        return out
    rel, elements = relative_error([r.get("compare") for r in results])
    if rel is None:
        return {**out, "output_message": "no single-GPU output to compare with"}
    width = s.heads * s.head_dim
    if elements != case.batch * case.seq_len * width:
        return {
            **out,
            "output_rel_err": rel,
            "output_match": False,
            "output_message": f"ranks returned {elements} output values, the single run {case.batch * case.seq_len * width}",
        }
    grad_rel, _ = relative_error([results[0].get("grad_compare")]) if results[0].get("grad_compare") else (None, 0)
    # a compressed all-reduce rounds the gradients to its own dtype
    grad_tol = max(tol, TOLERANCE[s.grad_compression]) if s.grad_compression and strategy.name == "mp" else tol
    match = rel <= tol and (grad_rel is None or grad_rel <= grad_tol)
    out.update(
        output_rel_err=rel,
        output_match=match,
        grad_rel_err=grad_rel,
        grad_tolerance=grad_tol if grad_rel is not None else None,
    )
    if not match:
        what = (
            f"output relative error {rel:.2e} > tolerance {tol:.0e}"
            if not rel <= tol
            else f"parameter-gradient relative error {grad_rel:.2e} > tolerance {grad_tol:.0e}"
        )
        out["output_message"] = f"differs from the single-GPU run: {what} ({s.dtype})"
    return out


def notes_for(row: dict[str, Any], strategy: Strategy) -> str:
    """What really happened, in words, from the row itself."""
    notes = list(strategy.notes(row)) if row["status"] == "ok" else []
    if row.get("output_match") is True:
        extra = f", gradients {row['grad_rel_err']:.1e}" if row.get("grad_rel_err") is not None else ""
        notes.append(f"output = single (rel. err {row['output_rel_err']:.1e}{extra})")
    elif row.get("output_message") and row["status"] == "ok":
        notes.append(row["output_message"])
    if row.get("nvml_note"):
        notes.append(f"{row['nvml_note']}: memory from torch only")
    if row["device"] == "cpu":
        notes.append(f"CPU: {row['processes']} process{'es' if row['processes'] > 1 else ''}, no GPU memory")
    return "; ".join(notes)


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------


class Reporter(BaseReporter, Protocol):
    def trial_started(self, case: Case, strategy: str) -> None: ...
    def trial_done(self, row: dict[str, Any], replayed: bool) -> None: ...


Launcher = Callable[..., list[dict[str, Any]]]
# what every rank of a speedup trial runs (named, so this module need not import torch)
RANK_JOB = "attnbench.sweeps.speedup_job:speedup_rank"


class SpeedupRunner(RunSession):
    def __init__(
        self,
        settings: SpeedupSettings,
        out_dir: Path,
        env: dict[str, Any],
        resume: bool = False,
        reporter: Reporter | None = None,
        launcher: Launcher | None = None,
    ) -> None:
        from attnbench.runtime.distributed import launch

        super().__init__(out_dir, env, resume, reporter)
        self.s = settings
        self.launch = launcher or launch
        self.done: dict[str, dict[str, Any]] = {}
        self.verified = False

    def prepare(self) -> None:
        """Refuse to mix runs; load what a resumed run already has."""
        rows = self.resumed_rows()
        if rows:
            self.done = {r["key"]: r for r in rows if r.get("kind") == KIND and "key" in r}
            case = asdict(self._verify_case())
            # a forward-only check row names no mode (only fwd_bwd is written)
            self.verified = any(
                r.get("kind") == "verify"
                and r.get("status") == "pass"
                and all(
                    r.get(k, "fwd" if k == "mode" else None) == v
                    for k, v in case.items()
                    if k not in ("batch", "seq_len")
                )
                for r in rows
            )
            self.run_id = next((r["run"] for r in rows if r.get("kind") == KIND and r.get("run")), self.run_id)

    def _verify_case(self) -> VerifyCase:
        s = self.s
        impl = impls.build(s.impl, **s.config)
        return VerifyCase(
            s.impl,
            impl.config(),
            min(s.cases[0].batch, 2),
            impl.verify_seq_len(),
            s.heads,
            s.head_dim,
            s.causal,
            s.dtype,
            s.device,
        )

    def run(self) -> bool:
        """Every case and strategy; False when the reference check failed (nothing ran)."""
        self.prepare()
        rows = None if self.verified else self.verify()
        with ResultsLock(self.out_dir):  # one run per directory
            self.prepare()  # again under the lock
            if rows is not None and not self.verified and not self.record_verify(rows):
                return False
            self.run_cases()
        return True

    def verify(self) -> list[dict[str, Any]]:
        """The configuration against the float64 reference at a small length; one that cannot
        run at all is bad input. Writes nothing (a profile checks every part first)."""
        return self.run_checks([self._verify_case()])

    def record_verify(self, rows: list[dict[str, Any]]) -> bool:
        self.verified = self.record_checks(rows)
        return self.verified

    def run_cases(self) -> None:
        for case in self.s.cases:
            with tempfile.TemporaryDirectory(prefix="attnbench-speedup-") as scratch:
                self._run_case(case, Path(scratch))

    def _run_case(self, case: Case, reference: Path) -> None:
        have_reference = False
        for name in self.s.order():
            strategy = strategies.get(name)
            fields = self._fields(case, strategy)
            key = trial_key(fields)
            if key in self.done:
                self.reporter.trial_done(self.done[key], True)
                continue
            self.reporter.trial_started(case, name)
            reason = refusal(self.s, case, strategy)
            if reason:
                self._finish(
                    {
                        **fields,
                        "key": key,
                        "status": "skipped",
                        "message": reason,
                        "times_ms": [],
                        "output_match": None,
                        "note": reason,
                        "gpus": [],
                    },
                    time.monotonic(),
                    now_utc(),
                )
                continue
            if name != "single" and not have_reference:
                have_reference = self._replay_reference(case, reference)
            started, t0 = now_utc(), time.monotonic()
            role = "reference" if name == "single" else "measure"
            results = self._launch(case, strategy, reference, role)
            row = {**fields, "key": key, **merge_ranks(results, self.s, case, strategy)}
            if name == "single":
                have_reference = row["status"] == "ok"
            elif not have_reference and row["status"] == "ok":
                single = self.done.get(trial_key(self._fields(case, strategies.get("single"))), {})
                row["output_message"] = (
                    f"no single-GPU output to compare with (single: {single.get('status', 'not run')})"
                )
            row["note"] = notes_for(row, strategy)
            self._finish(row, t0, started)

    def _replay_reference(self, case: Case, reference: Path) -> bool:
        """A resumed run lost the single output with its scratch directory: compute it again
        (untimed) if the single trial succeeded."""
        single = strategies.get("single")
        row = self.done.get(trial_key(self._fields(case, single)))
        if not row or row.get("status") != "ok":
            return False
        results = self._launch(case, single, reference, "reference-only")
        return all(r.get("status") == "ok" for r in results)

    def _launch(self, case: Case, strategy: Strategy, reference: Path, role: str) -> list[dict[str, Any]]:
        s = self.s
        payload = {
            "strategy": strategy.name,
            "strategy_module": strategy.module_name,
            "workload": s.workload(case).to_dict(),
            "module": s.module,
            "gpus": s.gpus,
            "grad_compression": s.grad_compression if strategy.name == "mp" else None,
            "seed": case.seq_len * 131 + case.batch,
            "timing": s.timing,
            "max_trial_seconds": s.max_trial_seconds,
            "reference_dir": str(reference),
            "role": role,
        }
        return self.launch(RANK_JOB, payload, strategy.processes(s.gpus), s.device, phase_limit_s=s.max_trial_seconds)

    def _fields(self, case: Case, strategy: Strategy) -> dict[str, Any]:
        s = self.s
        return {
            "kind": KIND,
            "run": self.run_id,
            "case": case.label,
            "strategy": strategy.name,
            "world_size": strategy.world_size(s.gpus),
            "module": s.module,
            "grad_compression": s.grad_compression if strategy.name == "mp" else None,
            **s.workload(case).to_dict(),
            "max_trial_seconds": s.max_trial_seconds,
        }

    def _finish(self, row: dict[str, Any], t0: float, started: str) -> None:
        row.update(
            trial=uuid.uuid4().hex[:12], started_at=started, duration_s=round(time.monotonic() - t0, 3), env=self.env
        )
        self.append(row)
        self.done[row["key"]] = row
        self.reporter.trial_done(row, False)
