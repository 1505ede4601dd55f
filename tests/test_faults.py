"""Faults that once gave a traceback or left a mixed directory (issue 54), each now one line,
the right exit code and nothing half-made: a results directory whose lock cannot be removed, a
report that cannot be replaced whole, paths of any bytes under any locale, ranks whose agent
died while they were still starting, and a closed terminal (SIGHUP)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnbench.errors import AttnbenchError
from attnbench.results import MANIFEST, ResultsLock, utf8, write_files_whole, write_text_atomic

from conftest import ROOT, main_in_process

CPU = ["--device", "cpu", "--dtype", "fp32", "--heads", 1, "--head-dim", 8]
RUN = ROOT / "tests" / "fixtures" / "cpu-gate" / "run1"


def contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones too) and a digest of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def wait_for(condition, what: str, limit_s: float = 120.0) -> None:
    """Wait for an event (not a time): the limit only stops a broken test from hanging."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


# --- a lock that cannot be removed never hides the error that ended the run ----------------


def _unlink_refused_for_locks(monkeypatch):
    """A directory made read-only while the run held it: the lock file cannot be removed."""
    unlink = os.unlink

    def refusing(path, *args, **kwargs):
        if str(path).endswith(".lock"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refusing)


def test_the_lock_left_behind_never_replaces_the_error_that_ended_the_run(tmp_path, monkeypatch):
    _unlink_refused_for_locks(monkeypatch)
    with pytest.raises(AttnbenchError, match="cannot write a result row"):
        with ResultsLock(tmp_path / "run"):
            raise AttnbenchError("cannot write a result row to run/trials.jsonl (Permission denied)")
    with ResultsLock(tmp_path / "run"):  # the file it left locks nothing: the next run takes it
        pass


def test_a_run_whose_results_directory_turns_read_only_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    """After two rows the directory refuses the third (and the lock's removal): one error line,
    exit 2, the two rows as they were written."""
    from attnbench.results import write as write_mod

    _unlink_refused_for_locks(monkeypatch)
    append = write_mod.ResultsWriter.append
    written = []

    def third_refused(self, row):
        if len(written) == 2:
            raise AttnbenchError(f"cannot write a result row to {self.path} (Permission denied)")
        append(self, row)
        written.append(row)

    monkeypatch.setattr(write_mod.ResultsWriter, "append", third_refused)
    out = tmp_path / "run"
    code = main_in_process("bench", "--impl", "naive", "--seq-lens", "128,256,384", *CPU, "--in-process", "--out", out)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and lines == [f"error: cannot write a result row to {out / 'trials.jsonl'} (Permission denied)"]
    # the two rows written before the refusal, whole (the reference checks first: one at the
    # sweep's shape, one at a longer length)
    kept = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
    assert len(written) == 2 and [r["kind"] for r in kept] == [r["kind"] for r in written]
    assert [r.get("seq_len") for r in kept] == [r.get("seq_len") for r in written]


# --- a report is replaced whole or not at all ------------------------------------------------


def previous_report(out: Path) -> dict[str, str]:
    """A report of two CSVs and report.md written into ``out``, as its manifest lists them."""
    write_files_whole(out, {"report.md": b"old report\n", "csv/a.csv": b"a,1\n", "csv/b.csv": b"b,1\n"})
    return contents(out)


NEW = {"report.md": b"new report\n", "csv/a.csv": b"a,2\n", "csv/c.csv": b"c,2\n"}


def test_a_new_report_replaces_the_previous_one_whole(tmp_path):
    previous_report(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    write_files_whole(tmp_path, NEW)
    expected = {name: hashlib.sha256(data).hexdigest() for name, data in NEW.items()}
    expected |= {"notes.txt": hashlib.sha256(b"mine").hexdigest()}
    expected |= {MANIFEST: hashlib.sha256(b"report.md\ncsv/a.csv\ncsv/c.csv\n").hexdigest()}
    assert contents(tmp_path) == expected  # b.csv, the previous report's alone, is gone


def test_a_read_only_file_of_the_previous_report_stops_it_before_any_rename(tmp_path):
    before = previous_report(tmp_path)
    (tmp_path / "report.md").chmod(0o444)
    with pytest.raises(AttnbenchError) as err:
        write_files_whole(tmp_path, NEW)
    assert str(err.value).startswith(f"cannot write {tmp_path / 'report.md'}: it is read-only")
    assert contents(tmp_path) == before


@pytest.mark.parametrize("failing", ["report.md", "csv/c.csv", MANIFEST])
def test_a_rename_that_fails_half_way_puts_the_previous_report_back(tmp_path, monkeypatch, failing):
    before = previous_report(tmp_path)
    replace = os.replace

    def failing_rename(src, dst, *args, **kwargs):
        if Path(dst) == tmp_path / failing and ".previous" not in str(src):  # the new file's move only
            raise OSError(errno.EIO, "Input/output error", str(dst))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing_rename)
    with pytest.raises(AttnbenchError) as err:
        write_files_whole(tmp_path, NEW)
    assert str(err.value).startswith(f"cannot write {tmp_path / failing} (Input/output error)")
    assert "the previous report is as it was" in str(err.value)
    assert contents(tmp_path) == before and not (tmp_path / "csv" / "c.csv").exists()


def test_report_into_a_directory_with_a_read_only_report_md_is_one_line_and_leaves_it_whole(tmp_path, capsys):
    out = tmp_path / "report"
    assert main_in_process("report", RUN, "--out", out) == 0
    before = contents(out)
    (out / "report.md").chmod(0o444)
    capsys.readouterr()
    assert main_in_process("report", ROOT / "tests" / "fixtures" / "results" / "cpu-tiny", "--out", out) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot write {out / 'report.md'}: it is read-only")
    assert contents(out) == before


# --- paths of any bytes, under any locale ---------------------------------------------------


def test_text_of_undecodable_bytes_is_written_as_utf_8():
    # what an ASCII locale makes of /tmp/é (bytes c3 a9), and of a byte that is no UTF-8 (ff)
    assert utf8(os.fsdecode(b"/tmp/\xc3\xa9")) == "/tmp/é".encode()
    assert utf8("/tmp/\udcff") == b"/tmp/\\xff"
    assert utf8("a lone \ud800 from a JSON escape") == b"a lone \\ud800 from a JSON escape"
    assert utf8("plain") == b"plain"


def test_a_derived_file_with_undecodable_text_is_written(tmp_path):
    write_text_atomic(tmp_path / "sweep.md", "run in /tmp/r\udcc3\udca9sults\n")
    assert (tmp_path / "sweep.md").read_text(encoding="utf-8") == "run in /tmp/résults\n"


@pytest.mark.slow
@pytest.mark.parametrize("name", [b"r\xc3\xa9sults", b"r\xffsults"], ids=["non-ascii", "not-utf-8"])
def test_report_of_a_path_of_any_bytes_under_an_ascii_locale(tmp_path, name):
    """The command line (with its path) is echoed into the report: under LC_ALL=C it holds
    surrogates, which are written as the path's bytes (UTF-8) or escaped (others)."""
    results = Path(os.fsdecode(bytes(tmp_path) + b"/" + name))
    results.mkdir()
    (results / "trials.jsonl").write_bytes((RUN / "trials.jsonl").read_bytes())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}
    proc = subprocess.run(
        [sys.executable, "-m", "attnbench", "report", os.fsencode(results)], env=env, capture_output=True
    )
    assert proc.returncode == 0 and b"Traceback" not in proc.stderr, proc.stderr
    text = (results / "report" / "report.md").read_bytes().decode("utf-8")  # UTF-8 whatever the locale
    shown = "résults" if name == b"r\xc3\xa9sults" else "r\\xffsults"
    assert f"attnbench report {tmp_path}/{shown}" in text


# --- ranks die with their agent, whatever moment it dies -------------------------------------

# In a rank (torchrun sets LOCAL_RANK; its agent has none): start up as if importing torch took
# until the test says go, having recorded the rank's pid. The agent dies meanwhile.
SLOW_START = """
import os, time
folder = os.environ.get("ATTNBENCH_TEST_RANKS")
if folder and "LOCAL_RANK" in os.environ:
    with open(os.path.join(folder, "starting" + os.environ["RANK"]), "w") as f:
        f.write(str(os.getpid()))
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.05)
"""

RANKS_PARENT = """
import sys
from attnbench.runtime.distributed import launch
from worker_jobs import Folder, sleep_forever
launch(sleep_forever, Folder(sys.argv[1]), 2, "cpu", 3600)
"""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[1])


@pytest.mark.distributed
def test_ranks_still_starting_when_attnbench_is_killed_end_once_they_run(tmp_path):
    """attnbench -> torchrun agent -> two ranks, each in a session of its own and still
    starting (not yet able to ask for the parent-death signal) when attnbench is SIGKILLed and
    its keeper ends the agent: as they go on they find their agent gone and end, rather than
    import torch and wait on a rendezvous store nobody serves."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_START)
    path = os.pathsep.join(map(str, (site, ROOT, ROOT / "tests")))
    env = {**os.environ, "PYTHONPATH": path, "ATTNBENCH_TEST_RANKS": str(tmp_path)}
    parent = subprocess.Popen([sys.executable, "-c", RANKS_PARENT, str(tmp_path)], env=env)
    starting = [tmp_path / f"starting{r}" for r in (0, 1)]
    wait_for(lambda: all(p.exists() and p.read_text() for p in starting), "both ranks to start", 300)
    ranks = [int(p.read_text()) for p in starting]
    agent = _parent(ranks[0])
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    wait_for(lambda: not _alive(agent), "the keeper to end the agent")
    (tmp_path / "go").write_text("")  # the ranks go on starting, their agent gone
    wait_for(lambda: not any(_alive(pid) for pid in ranks), "the ranks to end")
    assert not list(tmp_path.glob("rank*.pid"))  # neither reached the job


# --- a closed terminal (SIGHUP) stops a run as SIGTERM does ------------------------------------


@pytest.mark.slow
def test_sighup_stops_a_run_as_sigterm_does_and_exits_129(tmp_path):
    out = tmp_path / "run"
    lens = ",".join(str(128 * k) for k in range(1, 33))  # more trials than run before the signal
    args = ["bench", "--impl", "naive", "--seq-lens", lens, *CPU, "--out", out]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnbench", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a run started from a terminal: the tests may run under nohup, whose ignored SIGHUP
        # the run would inherit and rightly keep (the test below)
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )
    trials = out / "trials.jsonl"
    wait_for(lambda: trials.exists() and '"points"' in trials.read_text(), "a first trial", 300)
    proc.send_signal(signal.SIGHUP)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGHUP, stderr
    assert f"continue with --resume --out {out}" in stderr and "Traceback" not in stderr
    assert (out / "sweep.md").exists() and (out / "trials.csv").exists()  # its tables were written
    rows = [json.loads(line) for line in trials.read_text().splitlines()]
    assert rows and all(r["kind"] in ("verify", "points") for r in rows)


def test_a_sighup_ignored_at_start_stays_ignored():
    """Under ``nohup`` a closed terminal must not stop the run."""
    from attnbench.errors import install_interrupt_handlers, interrupt_on_signal

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    hook = sys.unraisablehook
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        install_interrupt_handlers()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        install_interrupt_handlers()
        assert signal.getsignal(signal.SIGHUP) == interrupt_on_signal
    finally:
        sys.unraisablehook = hook
        for s, handler in handlers.items():
            signal.signal(s, handler)


def test_sighup_is_its_own_interrupt_with_exit_129():
    from attnbench.errors import HungUp, interrupt_exit_code, interrupt_on_signal, raise_pending_interrupt

    with pytest.raises(HungUp):
        interrupt_on_signal(signal.SIGHUP, None)
    with pytest.raises(HungUp):
        raise_pending_interrupt()  # kept in case Python lost it, raised once
    assert interrupt_exit_code(HungUp()) == 129
