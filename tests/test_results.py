"""Result files survive: every write is checked (a full file system or a file-size limit
stops the run with one line and leaves every finished row readable), and readers refuse what
no run writes (impossible numbers, a trial counted twice, a line nested 100,000 deep, a FIFO
at the results file's name, an output path through a link or with an over-long name).

Full file systems are produced without mounting anything: by an injected ``os.write`` that
writes part of a row and then fails as a full disk does, and by a real file-size limit
(RLIMIT_FSIZE) on a fresh process, where the kernel cuts the write short."""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.errors import AttnbenchError
from attnbench.results import ResultsWriter, check_output_dir, read_rows, rows_to_resume

from conftest import ROOT, main_in_process, run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "results" / "cpu-tiny" / "trials.jsonl"
ROWS = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
TRIAL = next(r for r in ROWS if r["kind"] == "max-seq" and r["status"] == "ok" and len(r["times_ms"]) >= 3)


def write_lines(path: Path, rows: list, raw: list[str] = ()) -> Path:
    """Rows as a run writes them (json.dumps writes NaN and Infinity as their literals), then raw lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(line + "\n" for line in raw))
    return path


def attnbench(capsys, *args):
    """`attnbench ARGS` in this process: exit code, stdout, stderr."""
    code = main_in_process(*args)
    out, err = capsys.readouterr()
    return code, out, err


def one_line_error(proc: subprocess.CompletedProcess, hint: str) -> None:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[-1].startswith("error: ") and hint in lines[-1], proc.stderr
    assert not [line for line in lines if line.startswith("error") and line is not lines[-1]]


# --- rows no measurement can give ---------------------------------------------------------


def with_gpu_total(row: dict) -> dict:
    return {**row, "device_total_bytes": 80 << 30}


IMPOSSIBLE = {
    "negative sample": (lambda r: {**r, "times_ms": [1.0, -2.5, 1.1]}, "'times_ms'[1] is -2.5"),
    "NaN time": (lambda r: {**r, "time_ms": float("nan")}, "'time_ms' is nan"),
    "infinite sample": (lambda r: {**r, "times_ms": [1.0, float("inf")]}, "'times_ms'[1] is inf"),
    "NaN sample": (lambda r: {**r, "times_ms": [1.0, float("nan"), 1.2]}, "'times_ms'[1] is nan"),
    "infinities that cancel": (lambda r: {**r, "times_ms": [float("inf"), float("-inf")]}, "'times_ms'[1] is -inf"),
    "negative peak": (lambda r: {**r, "peak_bytes": -4096}, "'peak_bytes' is -4096"),
    "peak of 10^30 bytes": (lambda r: {**r, "peak_bytes": 10**30}, "'peak_bytes' is 1e+30 bytes"),
    "peak beyond the device": (
        lambda r: with_gpu_total({**r, "max_memory_allocated": 81 << 30}),
        "'max_memory_allocated' is 8.7e+10 bytes, beyond the device's 8.59e+10",
    ),
    "negative length": (lambda r: {**r, "seq_len": -1024}, "'seq_len' is -1024"),
    "negative rank time": (
        lambda r: {**r, "ranks": [{"rank": 0, "times_ms": [0.5, -0.1]}]},
        "'ranks'[0]['times_ms'][1]",
    ),
}


@pytest.mark.parametrize("name", list(IMPOSSIBLE))
def test_an_impossible_row_is_skipped_with_file_line_and_field(name, tmp_path):
    change, named = IMPOSSIBLE[name]
    path = write_lines(tmp_path / "trials.jsonl", [ROWS[0], change(TRIAL), ROWS[1]])
    rows, problems = read_rows(path)
    assert [r["kind"] for r in rows] == ["verify", "verify"]
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: impossible row skipped (field "), problems
    assert named in problems[0]


def test_samples_are_judged_one_by_one_not_by_their_sum(tmp_path):
    """Two finite samples whose sum overflows to infinity are possible; a negative one among
    many is not, wherever it lies."""
    path = write_lines(tmp_path / "trials.jsonl", [{**TRIAL, "times_ms": [1e308, 1e308]}])
    rows, problems = read_rows(path)
    assert problems == [] and rows[0]["times_ms"] == [1e308, 1e308]
    path = write_lines(tmp_path / "b" / "trials.jsonl", [{**TRIAL, "times_ms": [1.0] * 40 + [-1e-9] + [2.0] * 9}])
    rows, problems = read_rows(path)
    assert rows == [] and "'times_ms'[40] is -1e-09" in problems[0]


def test_a_reader_of_some_rows_types_those_and_leaves_the_others_unjudged(tmp_path):
    """``keep`` (what predict passes for one implementation): the rows kept are the ones a
    whole read holds for that implementation; a row not kept is never judged, even an
    impossible one, while a line no reader can decode is still named."""
    from attnbench.results import load_rows

    other = {**TRIAL, "impl": "elsewhere", "trial": "other-1", "peak_bytes": -4096}
    path = write_lines(tmp_path / "trials.jsonl", [*ROWS, other], raw=["{not json"])
    whole, whole_problems = load_rows(path)
    kept, problems = load_rows(path, keep=lambda row: row.get("impl") == TRIAL["impl"])
    assert [r.source for r in kept] == [r.source for r in whole if r.impl == TRIAL["impl"]] and kept
    assert any("impossible row skipped" in p for p in whole_problems)
    assert [p.split(": ", 1)[1][:24] for p in problems] == ["unreadable line skipped "]


def test_the_last_line_is_read_without_its_newline_and_lines_keep_their_numbers(tmp_path):
    """Lines are read one at a time (a history is never held whole): a last row without its
    newline is a row, and a bad line is named by its number as before."""
    path = write_lines(tmp_path / "trials.jsonl", [ROWS[0]], raw=["{not json"])
    path.write_text(path.read_text() + json.dumps(ROWS[1]))
    rows, problems = read_rows(path)
    assert [r["kind"] for r in rows] == [ROWS[0]["kind"], ROWS[1]["kind"]]
    assert problems and problems[0].startswith(f"{path}:2: unreadable line skipped")


def test_a_line_ending_in_the_last_environment_reads_as_the_whole_line_does(tmp_path):
    """The reader decodes a run's environment once and gives it to every later line that ends
    with the same text: those rows equal the rows of each line decoded alone, and a broken line
    that ends with that environment gets the error its whole text gets."""
    from attnbench.results.read import LineDecoder, _decode

    tail = json.dumps({"env": ROWS[0]["env"]})[1:]  # '"env": {...}}'
    broken = ['{"kind": "points", "x": }, ' + tail, "{, " + tail, '{"kind": "x", "a": "\\", ' + tail]
    path = write_lines(tmp_path / "trials.jsonl", ROWS, raw=broken)
    lines = path.read_bytes().splitlines()
    decode = LineDecoder()
    read = [decode(line) for line in lines]
    assert read == [_decode(line) for line in lines]
    assert decode.tail and sum(line.endswith(decode.tail) for line in lines) > len(ROWS) // 2
    assert all(row["env"] is read[0][0]["env"] for row, _ in read[1 : len(ROWS)])  # one environment held
    assert [problem[:24] for _, problem in read[len(ROWS) : len(ROWS) + 2]] == ["unreadable line skipped "] * 2


def test_a_history_read_on_after_appended_lines_is_the_file_read_whole(tmp_path):
    """A resumed run reads on from where it read its directory's file (``History.read_on``):
    the rows and problems are those of the whole file read again, duplicate trials and bad
    lines in the appended part included; a file replaced meanwhile is read whole."""
    from attnbench.results import load_rows
    from attnbench.results.read import History

    def same(a, b):
        assert [(r.source, r.to_json()) for r in a[0]] == [(r.source, r.to_json()) for r in b[0]]
        assert a[1] == b[1]

    half = len(ROWS) // 2
    path = write_lines(tmp_path / "run" / "trials.jsonl", ROWS[:half], raw=["{not json"])
    history = History.read(path)
    same((history.rows, history.problems), load_rows(path))
    other_machine = {**ROWS[-1], "trial": "other-1", "env": {**ROWS[-1]["env"], "machine": "elsewhere"}}
    with open(path, "a") as f:
        again = next(r for r in ROWS[:half] if isinstance(r.get("trial"), str))
        f.write("".join(json.dumps(r) + "\n" for r in [*ROWS[half:], again, other_machine]) + "[]\n")
    same(history.read_on(), load_rows(path))
    assert any("duplicate row skipped" in p for p in history.problems)

    replaced = History.read(path)
    path.unlink()
    write_lines(path, ROWS[:3])
    same(replaced.read_on(), load_rows(path))

    cut = json.dumps(ROWS[3])
    path.write_text(path.read_text() + cut[:40])  # a row cut short, then the rest of it
    unfinished = History.read(path)
    path.write_text(path.read_text() + cut[40:] + "\n")
    same(unfinished.read_on(), load_rows(path))
    assert len(unfinished.rows) == 4


def test_the_gate_refuses_an_impossible_current_run_unless_told_to_skip(tmp_path, capsys):
    base = write_lines(tmp_path / "base" / "trials.jsonl", ROWS)
    bad = [({**r, "peak_bytes": -r["peak_bytes"]} if r.get("trial") == TRIAL["trial"] else r) for r in ROWS]
    cur = write_lines(tmp_path / "cur" / "trials.jsonl", bad)
    code, out, err = attnbench(capsys, "check", "--baseline", base, "--current", cur)
    assert code == 2 and f"{cur}:" in err and "'peak_bytes' is -" in err and "Traceback" not in err
    code, out, err = attnbench(
        capsys, "check", "--baseline", base, "--current", cur, "--skip-unreadable", "--allow-missing"
    )
    assert code == 0 and "impossible row" in err, out + err


def test_every_committed_row_is_possible():
    rows, problems = read_rows(ROOT / "results")
    assert problems == [] and len(rows) > 500


def test_a_duplicated_trial_row_is_counted_once(tmp_path, capsys):
    path = write_lines(tmp_path / "dup" / "trials.jsonl", ROWS + [TRIAL])
    rows, problems = read_rows(path)
    assert len(rows) == len(ROWS)
    assert problems == [
        f"{path}:{len(ROWS) + 1}: duplicate row skipped (trial {TRIAL['trial']}, counted once at "
        f"{path}:{ROWS.index(TRIAL) + 1})"
    ]
    # in the gate: the trial's samples are one process, not two
    base = write_lines(tmp_path / "base" / "trials.jsonl", ROWS)
    code, out, err = attnbench(
        capsys, "check", "--baseline", base, "--current", path, "--skip-unreadable", "--format", "json"
    )
    report = json.loads(out)
    timed = [f for f in report["findings"] if f["aspect"] == "time" and f["numbers"]["seq_len"] == TRIAL["seq_len"]]
    assert code == 0 and [f["numbers"]["processes_current"] for f in timed if "naive" in f["trial"]] == [1]


# --- hostile lines and files --------------------------------------------------------------

DEEP = "[" * 100_000 + "]" * 100_000
DEEP_ROW = '{"schema": 1, "kind": "verify", "config": ' + "[" * 50 + "]" * 50 + "}"


def test_a_line_nested_100000_deep_is_skipped_by_every_reader(tmp_path, capsys):
    out = tmp_path / "run"
    write_lines(out / "trials.jsonl", ROWS, raw=[DEEP, DEEP_ROW])
    rows, problems = read_rows(out)
    assert len(rows) == len(ROWS)
    assert [p.split(": ", 1)[0] for p in problems] == [f"{out / 'trials.jsonl'}:{len(ROWS) + i}" for i in (1, 2)]
    assert "nested" in problems[0] and "nested 51 levels deep" in problems[1]
    # check --skip-unreadable compares the rest
    base = write_lines(tmp_path / "base" / "trials.jsonl", ROWS)
    code, _, err = attnbench(capsys, "check", "--baseline", base, "--current", out, "--skip-unreadable")
    assert code == 0 and "nested" in err and "RecursionError" not in err
    # --resume reads the directory it continues
    assert len(rows_to_resume(out, True, ROWS[0]["env"]["machine"])[0]) == len(ROWS)


@pytest.mark.slow
def test_report_reads_past_a_line_nested_100000_deep(tmp_path):
    out = tmp_path / "run"
    write_lines(out / "trials.jsonl", ROWS, raw=[DEEP])
    proc = run_cli("report", out, "--out", tmp_path / "report")
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{out / 'trials.jsonl'}:{len(ROWS) + 1}" in proc.stderr and "nested" in proc.stderr


def within(seconds: int, fn, *args):
    """``fn(*args)``, failing instead of hanging when it blocks longer than ``seconds``."""

    def hung(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        return fn(*args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def test_a_fifo_at_the_results_name_is_refused_not_waited_on(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / "trials.jsonl")
    with pytest.raises(AttnbenchError, match="not a regular file"):
        within(10, rows_to_resume, out, True, "cpu: test")
    with pytest.raises(AttnbenchError, match="not a regular file"):
        within(10, read_rows, out / "trials.jsonl")
    with pytest.raises(AttnbenchError, match="not a regular file"):
        within(10, ResultsWriter(out).append, ROWS[0])


# --- output paths -------------------------------------------------------------------------


def test_out_through_a_symbolic_link_is_refused(tmp_path):
    target = tmp_path / "real"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(
        AttnbenchError, match=r"--out .*link is a symbolic link \(to .*real\).*give the directory itself"
    ):
        check_output_dir(tmp_path / "link")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(AttnbenchError, match="symbolic link"):
        check_output_dir(tmp_path / "dangling")
    check_output_dir(tmp_path / "link" / "run")  # a link above --out is the user's layout, not a planted name


def test_a_300_character_out_name_is_one_line(tmp_path):
    with pytest.raises(AttnbenchError, match="a name of 300 bytes .* longer than the file system's 255"):
        check_output_dir(tmp_path / ("r" * 300))
    with pytest.raises(AttnbenchError, match="longer than the file system's"):
        check_output_dir(tmp_path / ("r" * 300) / "run")


def test_out_on_a_full_file_system_is_refused_before_any_work(tmp_path, monkeypatch):
    full = os.statvfs(tmp_path)
    monkeypatch.setattr(os, "statvfs", lambda p: os.statvfs_result((*full[:4], 0, *full[5:])))  # f_bavail: none left
    with pytest.raises(AttnbenchError, match="0 bytes free"):
        check_output_dir(tmp_path / "run")


@pytest.mark.slow
def test_odd_out_paths_are_one_line_from_the_command(tmp_path):
    (tmp_path / "link").symlink_to(tmp_path)
    args = ["bench", "--impl", "naive", "--seq-lens", "128", "--device", "cpu", "--dtype", "fp32"]
    one_line_error(run_cli(*args, "--out", tmp_path / "link"), "symbolic link")
    one_line_error(run_cli(*args, "--out", tmp_path / ("r" * 300)), "longer than the file system's")
    assert not list(tmp_path.glob("r*"))


# --- writes that do not fit -----------------------------------------------------------------


def test_a_short_write_is_cut_back_and_said(tmp_path, monkeypatch):
    """The disk fills in the middle of a row: os.write takes part of it, then ENOSPC."""
    writer = ResultsWriter(tmp_path)
    writer.append(ROWS[0])
    before = (tmp_path / "trials.jsonl").read_bytes()
    real_write = os.write
    calls = []

    def full_disk(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(
        AttnbenchError, match=r"cannot write a result row to .*trials.jsonl \(No space left on device\)"
    ):
        writer.append(ROWS[1])
    assert len(calls) == 2  # the short write was noticed and retried
    assert (tmp_path / "trials.jsonl").read_bytes() == before
    monkeypatch.setattr(os, "write", real_write)  # space freed: the next row starts its own line
    writer.append(ROWS[2])
    rows, problems = read_rows(tmp_path)
    assert problems == [] and [r["impl"] for r in rows] == [ROWS[0]["impl"], ROWS[2]["impl"]]


def limited(limit_bytes: int):
    """preexec_fn: a file-size limit for the child (Python ignores SIGXFSZ, so a write past it
    is cut short or fails with EFBIG, as on a full disk)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))


def bench_under_limit(out: Path, limit_bytes: int) -> subprocess.CompletedProcess:
    args = ["bench", "--impl", "naive", "--impl", "sdpa", "--seq-lens", "128,256", "--device", "cpu"]
    args += ["--dtype", "fp32", "--heads", "1", "--head-dim", "8", "--in-process", "--out", str(out)]
    return subprocess.run(
        [sys.executable, "-m", "attnbench", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        preexec_fn=limited(limit_bytes),
    )


@pytest.mark.slow
@pytest.mark.parametrize("limit_bytes", [1000, 6000])
def test_a_file_size_limit_stops_the_run_with_one_line_and_every_row_readable(tmp_path, limit_bytes):
    """1000 bytes: the first row (a reference check's) does not fit, as on a full disk when
    the run starts; 6000: it fills after a few rows, in the middle of one."""
    out = tmp_path / "run"
    proc = bench_under_limit(out, limit_bytes)
    one_line_error(proc, "cannot write a result row to")
    assert "(File too large)" in proc.stderr and "every row written before is kept" in proc.stderr
    data = (out / "trials.jsonl").read_bytes()
    assert len(data) <= limit_bytes and (data == b"" or data.endswith(b"\n"))
    rows, problems = read_rows(out)
    assert problems == [] and len(rows) == data.count(b"\n")
    assert (len(rows) == 0) == (limit_bytes == 1000)


def test_a_table_that_does_not_fit_is_one_line_and_leaves_the_old_one(tmp_path):
    """A derived file (CSV, markdown, PNG) written into a full file system: one AttnbenchError
    line, the previous file untouched, no temporary file left."""
    (tmp_path / "sweep.md").write_text("old\n")
    code = (
        "from attnbench.errors import AttnbenchError\n"
        "from attnbench.results import write_text_atomic\n"
        "try:\n"
        f"    write_text_atomic(__import__('pathlib').Path({str(tmp_path / 'sweep.md')!r}), 'x' * 100_000)\n"
        "except AttnbenchError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=limited(4096),
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith(f"cannot write {tmp_path / 'sweep.md'} (File too large)"), proc.stdout
    assert (tmp_path / "sweep.md").read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["sweep.md"]


def test_a_run_leaves_no_lock_file_and_a_lock_taken_on_a_removed_file_is_not_held(tmp_path):
    from attnbench.results import LOCK_FILE, ResultsLock

    out = tmp_path / "run"
    first = ResultsLock(out).__enter__()
    late = os.open(out / LOCK_FILE, os.O_RDWR)  # a second run opened the file before the first ended
    first.__exit__(None, None, None)
    assert not (out / LOCK_FILE).exists(), "the lock file goes with the run that held it"
    # the late run's file is no longer the one named: holding it would lock nothing
    assert not ResultsLock(out)._still_named(late)
    os.close(late)
    with ResultsLock(out):
        with pytest.raises(AttnbenchError, match="another attnbench run"):
            ResultsLock(out).__enter__()
    assert sorted(p.name for p in out.iterdir()) == []


def test_reading_the_commit_never_writes_the_checkouts_index(tmp_path):
    """A run reads whether its checkout has changes with ``git status``, which would refresh a
    stale index under ``.git/index.lock``; a run killed meanwhile would leave the lock and break
    the user's next git command. It only reads: the index stays byte for byte as it was."""
    import os
    import shutil
    import subprocess

    from attnbench.results.environment import git

    if shutil.which("git") is None:
        pytest.skip("needs git")

    def run(*a):
        return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *a], cwd=tmp_path, check=True)

    run("init", "-q")
    (tmp_path / "f").write_text("a\n")
    run("add", "f")
    run("commit", "-qm", "x")
    st = (tmp_path / "f").stat()
    os.utime(tmp_path / "f", ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))  # the index's stat is stale
    index = (tmp_path / ".git" / "index").read_bytes()
    assert git("status", "--porcelain", "--untracked-files=no", cwd=tmp_path) == ""
    assert (tmp_path / ".git" / "index").read_bytes() == index
    assert not (tmp_path / ".git" / "index.lock").exists()
