"""How the readers scale with a results history: a benchmark (not a test).

    python scripts/reader_scale.py [--rows 10K,100K,1M] [--dir DIR] [--memory-cap 8GiB] [--keep]

For each row count it builds one synthetic history, DIR/ROWS/trials.jsonl, of valid rows:
the committed rows (every trials.jsonl under results/ and tests/fixtures/cpu-gate/) repeated
in turn, each copy under a run name and trial id of its own (``RUN~COPY``), as runs of the
same profiles made day after day would add them. The rows of tests/fixtures/cpu-gate/run1
(a `bench --repeat 3` on the CPU) come first, their machine set to this one's, so that the
history is this machine's run to resume. Then it runs, each in a fresh process, and prints
the wall seconds, the CPU seconds (user and system: on a machine shared with other work the
wall time grows with the load, the CPU time much less) and the peak resident memory (the
process's own, from wait4) of:

    report   attnbench report DIR --out TMP/report
    check    attnbench check --baseline DIR --current DIR --format json
    predict  attnbench predict --impl naive --gpu-memory 80GiB --from DIR
    resume   attnbench bench --resume --out DIR   (every trial already there: replayed, none run)

A command that passes --memory-cap (address space; default 8 GiB, so that a history too large
for the machine fails on its own instead of taking the machine's memory) or exits otherwise
than 0 (1 for check is a verdict, not a failure) is marked.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attnbench.results.environment import cpu_model, machine_key  # noqa: E402
from attnbench.units import format_bytes, parse_bytes  # noqa: E402

FIRST = ROOT / "tests" / "fixtures" / "cpu-gate" / "run1" / "trials.jsonl"  # this machine's run to resume
SOURCES = (ROOT / "results", ROOT / "tests" / "fixtures" / "cpu-gate")


def count(text: str) -> int:
    """'10K' -> 10_000, '1M' -> 1_000_000 (rows, decimal)."""
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def seed_rows() -> list[dict]:
    """The committed rows, FIRST's first with this machine as theirs."""
    cpu = cpu_model()
    first = [json.loads(line) for line in FIRST.read_text().splitlines() if line.strip()]
    for r in first:
        r["env"] = {**r["env"], "cpu": cpu, "machine": machine_key(r["env"].get("gpus"), cpu)}
    rest = [
        json.loads(line)
        for source in SOURCES
        for file in sorted(source.rglob("trials.jsonl"))
        if file != FIRST
        for line in file.read_text().splitlines()
        if line.strip()
    ]
    return first + rest


def build(rows: int, seeds: list[dict], out: Path) -> int:
    """``rows`` rows into out/trials.jsonl, copy after copy of ``seeds``; its size in bytes."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "trials.jsonl", "w") as f:
        for i in range(rows):
            copy, row = divmod(i, len(seeds))
            r = dict(seeds[row])
            if copy:
                r["run"] = f"{r['run']}~{copy}"
                if isinstance(r.get("trial"), str):
                    r["trial"] = f"{r['trial']}~{copy}"
            f.write(json.dumps(r) + "\n")
    return (out / "trials.jsonl").stat().st_size


def measure(argv: list[str], cap: int) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds, peak resident bytes, exit code) of ``python -m attnbench ARGV``."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnbench", *argv],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=limit,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.monotonic() - t0
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        print(f"    {argv[0]} exited {code}: {err.decode(errors='replace').strip().splitlines()[-1:]}", flush=True)
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024, code


def commands(history: Path, scratch: Path) -> dict[str, list[str]]:
    return {
        "report": ["report", str(history), "--out", str(scratch / "report")],
        "check": ["check", "--baseline", str(history), "--current", str(history), "--format", "json"],
        "predict": ["predict", "--impl", "naive", "--gpu-memory", "80GiB", "--from", str(history)],
        "resume": ["bench", "--resume", "--out", str(history)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="10K,100K,1M", help="row counts, e.g. 10K,100K,1M")
    parser.add_argument("--dir", type=Path, help="where the histories go (default: a temporary directory)")
    parser.add_argument("--memory-cap", default="8GiB", help="address space a command may take (default 8GiB)")
    parser.add_argument("--only", default="report,check,predict,resume", help="commands to time")
    parser.add_argument("--keep", action="store_true", help="keep the histories")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="attnbench-scale-"))
    cap = parse_bytes(args.memory_cap)
    seeds = seed_rows()
    print(f"{len(seeds)} committed rows; histories under {root}; memory cap {format_bytes(cap)}")
    print(f"{'rows':>9} {'MB':>7} {'command':>8} {'wall s':>8} {'CPU s':>8} {'peak RSS':>10}  exit")
    try:
        for n in (count(x) for x in args.rows.split(",")):
            history = root / str(n)
            size = build(n, seeds, history)
            with tempfile.TemporaryDirectory(prefix="attnbench-scale-out-") as scratch:
                for name, argv in commands(history, Path(scratch)).items():
                    if name not in args.only.split(","):
                        continue
                    wall, cpu, peak, code = measure(argv, cap)
                    line = f"{n:>9,} {size / 1e6:>7.0f} {name:>8} {wall:>8.1f} {cpu:>8.1f} {format_bytes(peak):>10}  {code}"
                    print(line, flush=True)
            if not args.keep:
                shutil.rmtree(history)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
