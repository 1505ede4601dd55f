"""Output on any stream and in any locale: a closed stdout, a reader that goes away (`| head`),
an ASCII locale, a path the locale cannot spell, a label the plot font cannot draw. None of
them is a traceback; a reader that goes away stops a run as an interrupt does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, run_cli

pytestmark = pytest.mark.slow  # each test runs the real command in a fresh process

FIXTURE = ROOT / "tests" / "fixtures" / "results" / "cpu-tiny"
TINY = ["--device", "cpu", "--dtype", "fp32", "--heads", 1, "--head-dim", 8, "--max-trial-seconds", 30]
# An ASCII locale: Python's UTF-8 mode off, the C locale not coerced to C.UTF-8.
ASCII = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0", "PYTHONIOENCODING": ""}


def rows(out, kind="points") -> list[dict]:
    lines = (out / "trials.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_a_closed_stdout_is_no_error_and_takes_no_file_s_place(tmp_path):
    out = tmp_path / "report"
    proc = subprocess.run(
        [sys.executable, "-m", "attnbench", "report", str(FIXTURE), "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stderr=subprocess.PIPE,
        text=True,
        pass_fds=(),
        preexec_fn=lambda: os.close(1),
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert (out / "report.md").read_text().startswith("#")


def test_a_reader_that_goes_away_stops_the_run_as_an_interrupt_does(tmp_path):
    """`attnbench bench ... | head -3`: once the pipe is closed the next line cannot be
    written; every finished trial is kept, the tables are written, the resume line goes to
    stderr and the exit is 141 (128 + SIGPIPE)."""
    out = tmp_path / "run"
    lengths = "128,256,512,1024"
    cmd = [sys.executable, "-m", "attnbench", "bench", "--impl", "naive", "--seq-lens", lengths, *map(str, TINY)]
    proc = subprocess.Popen(
        [*cmd, "--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in proc.stdout:  # read until the first trial is recorded (its line follows its row)
        if " point " in line:
            break
    proc.stdout.close()  # head exits
    err = proc.stderr.read()
    assert proc.wait(timeout=600) == 141, err
    assert f"--resume --out {out}" in err and "Traceback" not in err, err
    kept = rows(out)
    assert 1 <= len(kept) < 4 and (out / "sweep.md").exists()
    resumed = run_cli("bench", "--impl", "naive", "--seq-lens", lengths, *TINY, "--out", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(r["seq_len"] for r in rows(out)) == [128, 256, 512, 1024]


def test_a_reader_that_goes_away_from_a_listing_is_a_quiet_exit():
    """`attnbench list | head -1`: nothing was running, nothing is lost; no word on stderr, and
    the exit a closed pipe gives (141). The pipe's reading end is closed before the command
    starts, so its first line already finds no reader."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "attnbench", "list"],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=600,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141 and proc.stderr == "", proc.stderr


def test_a_closed_pipe_met_by_a_heartbeat_thread_stops_the_main_thread_once():
    """Under load a trial's heartbeat line can be the first to find the reader gone: that thread
    goes on quietly, and the main thread's next line stops the run (once), as if it had met it."""
    import threading

    from attnbench.cli.base import GuardedStream
    from attnbench.errors import OutputClosed

    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = GuardedStream(open(write_end, "w", buffering=1), write_end)
    met_in_thread = []

    def heartbeat():
        try:
            stream.write("    ... 10 s: timing\n")
        except OutputClosed:
            met_in_thread.append(True)

    beat = threading.Thread(target=heartbeat)
    beat.start()
    beat.join()
    assert met_in_thread == []
    with pytest.raises(OutputClosed):
        stream.write("  grow  2,048 (2K)  ok\n")
    stream.write("the tables, written after the stop\n")  # once: the run then writes its tables quietly
    stream.stream.close()


def test_a_run_in_an_ascii_locale_writes_every_trial(tmp_path):
    out = tmp_path / "run"
    proc = run_cli("bench", "--impl", "naive", "--seq-lens", "128,256", *TINY, "--out", out, env=ASCII)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert [r["status"] for r in rows(out)] == ["ok", "ok"]


def test_a_report_on_a_path_the_locale_cannot_spell(tmp_path):
    out = tmp_path / "rapport-été-報告"
    proc = run_cli("report", FIXTURE, "--out", out, env=ASCII)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "≥" in (out / "report.md").read_text(encoding="utf-8")  # the report itself stays UTF-8


def test_a_glyph_the_plot_font_lacks_is_one_line_without_source_paths(tmp_path):
    rows_in = [json.loads(line) for line in (FIXTURE / "trials.jsonl").read_text().splitlines() if line.strip()]
    for r in rows_in:
        if "label" in r:
            r["label"] = r["label"] + " 注意"
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_in))
    proc = run_cli("report", tmp_path, "--out", tmp_path / "report")
    assert proc.returncode == 0, proc.stderr
    assert "UserWarning" not in proc.stderr and ".py:" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "glyph" in line]
    assert len(said) == 1 and "注" in said[0] and "意" in said[0], proc.stderr  # DejaVu has no CJK glyphs
