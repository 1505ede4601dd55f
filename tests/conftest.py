import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args, cwd=None, timeout=600, env=None) -> subprocess.CompletedProcess:
    """Run `python -m attnbench ARGS` as a user would, in a fresh process."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "attnbench", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def in_process(capsys):
    """``run_cli`` through the console entry point in this process (``main_in_process``): no
    interpreter start or imports per call, which a fresh process pays for seconds on a busy
    machine. Returns what ``run_cli`` does: ``returncode``, ``stdout``, ``stderr``."""

    def call(*args):
        code = main_in_process(*args)
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)

    return call


@pytest.fixture(autouse=True)
def outside_code_imported_here():
    """A command run in this process (main_in_process, typer's CliRunner) installs the resolver
    that keeps outside code in worker processes; a library test after it expects the code
    imported here, as a notebook does."""
    yield
    from attnbench import impls  # imports no torch

    impls.resolve_outside_with(None, None)


@pytest.fixture(autouse=True)
def no_progress_display_outlives_its_test():
    """A trial's heartbeat thread left running prints a line every few seconds into whichever
    test runs next in this process: the test that left it fails, not a later one by chance."""
    yield
    progress = sys.modules.get("attnbench.cli.progress")  # not imported: no display ran
    left = [t for t in threading.enumerate() if progress and t.name == progress.HEARTBEAT_THREAD]
    assert not left, "a trial's progress display (its heartbeat thread) outlived the test"


def not_timed_out(rank) -> bool:
    """A rank of a run another rank failed (as the launch gives it back, or a row's rank line)
    that did not wait out its collective timeout: stopped by torchrun (no result of its own),
    or failed on the broken connection at once."""
    status, message = (rank["status"], rank.get("message")) if isinstance(rank, dict) else (rank.status, rank.message)
    message = str(message or "").lower()
    return status == "killed" or ("timed out" not in message and "timeout" not in message)


def main_in_process(*args) -> int:
    """`attnbench ARGS` through the console entry point, in this process (no torch import per
    call): its exit code. What main() installs (signal handlers, the unraisable hook, guarded
    stdout and stderr) and argv are put back (the outside-code resolver: by the fixture below)."""
    from attnbench import cli

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    argv, hook, streams = sys.argv, sys.unraisablehook, (sys.stdout, sys.stderr)
    sys.argv = ["attnbench", *map(str, args)]
    try:
        cli.main()
        return 0
    except SystemExit as exc:
        return exc.code
    finally:
        sys.argv, sys.unraisablehook = argv, hook
        sys.stdout, sys.stderr = streams
        for s, handler in handlers.items():
            signal.signal(s, handler)


def flex_pieces_config(pattern_type: str, **options) -> dict:
    """block-sparse through FlexAttention in pieces of 12 query blocks of 64 tokens: at 4096
    tokens six pieces, the last overlapping its neighbour (the GPU tests' configuration)."""
    from attnbench import impls

    return impls.build(
        "block-sparse",
        pattern_type=pattern_type,
        block_size=64,
        sparsity_ratio=0.1,
        kernel="flex",
        **{"max_chunk_tokens": 64 * 12, **options},
    ).config()


def flex_per_head_row(monkeypatch, mode: str = "fwd"):
    """The reference check of block-sparse through FlexAttention on CUDA with flex's offset
    limit lowered from 2^31 to 2^19 (above one (batch, head) of q, k, v at 4096 x 64, below the
    whole tensors), so flex runs once per (batch, head), as it does past 2^31 offsets."""
    # imported here: every test run loads conftest, and most need neither torch nor a GPU
    from attnbench.impls import flex_kernel
    from attnbench.trials.reference import VerifyCase, run_case

    monkeypatch.setattr(flex_kernel, "FLEX_MAX_OFFSET", 1 << 19)
    cfg = flex_pieces_config("hierarchical")
    return run_case(VerifyCase("block-sparse", cfg, 2, 4096, 3, 64, True, "bf16", "cuda", mode=mode))


def typed_row(kind: str = "points", **fields):
    """A typed result row (``attnbench.results.schema``) with the fields a test names; every other
    required field gets a valid value."""
    from attnbench.results.schema import SCHEMA_VERSION, row_from_json

    base = {
        "schema": SCHEMA_VERSION,
        "kind": kind,
        "run": "r",
        "impl": "dilated",
        "config": {},
        "batch": 1,
        "seq_len": 1024,
        "heads": 8,
        "head_dim": 64,
        "dtype": "bf16",
        "device": "cuda",
        "causal": False,
    }
    if kind in ("points", "max-seq", "speedup"):
        base.update(status="ok", message="", times_ms=[])
    if kind in ("points", "max-seq", "max-seq-result"):
        base.update(series="s", label="s")
    if kind == "speedup":
        base.update(case="c", key="k")
    if kind == "verify":
        base.update(status="pass", message="")
    return row_from_json({**base, **fields})


def single_rank_spec(reference_dir: Path, seed: int, samples: tuple[int, int], target_ms: float):
    """The single strategy's rank spec of a small naive speedup trial on the CPU (batch 2, 128
    tokens) that saves its output in ``reference_dir``, timed for ``samples`` (fewest, most)."""
    from attnbench.measure.timing import TimingPolicy
    from attnbench.trials.placed import OutputCheck, PlacedSpec
    from attnbench.trials.workload import Workload

    return PlacedSpec(
        strategy="single",
        strategy_module="attnbench.trials.strategies.single",
        workload=Workload(impl="naive", batch=2, seq_len=128, heads=2, head_dim=8, dtype="fp32", device="cpu"),
        seed=seed,
        timing=TimingPolicy(min_samples=samples[0], max_samples=samples[1], target_ms=target_ms, budget_s=10),
        limit_s=10,
        gpus=2,
        output=OutputCheck(reference_dir=str(reference_dir), role="reference"),
    )
