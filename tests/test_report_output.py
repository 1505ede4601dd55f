"""A report's files are one set: written whole into a temporary directory, then moved into
place; a write that fails leaves the previous report as it was; the next report into the same
directory removes the previous one's files, and only those."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import ROOT, main_in_process

pytestmark = pytest.mark.slow  # each test draws a report's figures (seconds)

FIXTURE = ROOT / "tests" / "fixtures" / "results" / "cpu-tiny"


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def other_machine(tmp_path: Path) -> Path:
    """The fixture's rows as if measured on another CPU: a second results set."""
    rows = [json.loads(line) for line in (FIXTURE / "trials.jsonl").read_text().splitlines() if line.strip()]
    for r in rows:
        r["env"] = {**r["env"], "machine": "cpu: another machine", "cpu": "another machine"}
    path = tmp_path / "other" / "trials.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.parent


def test_a_second_report_replaces_the_first_ones_files_and_only_those(tmp_path):
    out, alone = tmp_path / "report", tmp_path / "alone"
    second = other_machine(tmp_path)
    assert main_in_process("report", second, "--out", alone) == 0  # the truth: the second report by itself
    assert main_in_process("report", FIXTURE, "--out", out) == 0
    (out / "notes.txt").write_text("mine")  # the user's file, beside the report
    assert main_in_process("report", second, "--out", out) == 0
    assert set(snapshot(out)) == set(snapshot(alone)) | {"notes.txt"}
    assert (out / "notes.txt").read_text() == "mine"


def test_a_report_that_cannot_be_written_whole_leaves_the_old_one_untouched(tmp_path, capsys):
    out = tmp_path / "report"
    assert main_in_process("report", FIXTURE, "--out", out) == 0
    (out / "report.md").unlink()
    (out / "report.md").mkdir()  # a directory where the report writes a file
    before = snapshot(out)
    assert main_in_process("report", other_machine(tmp_path), "--out", out) == 2
    err = capsys.readouterr().err
    assert snapshot(out) == before and not list(out.glob(".staging-*"))
    assert "report.md" in err and "directory" in err and "free space" not in err, err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_report_directory_is_named_as_such(tmp_path, capsys):
    out = tmp_path / "report"
    assert main_in_process("report", FIXTURE, "--out", out) == 0
    before = snapshot(out)
    out.chmod(0o555)
    try:
        assert main_in_process("report", other_machine(tmp_path), "--out", out) == 2
    finally:
        out.chmod(0o755)
    err = capsys.readouterr().err
    assert snapshot(out) == before and "free space" not in err and "writable" in err, err


def test_a_label_of_several_lines_stays_on_one_line_everywhere(tmp_path):
    """Rows read from a file may hold any text: no line of a label becomes a heading or a table
    row of the report (its tables, headings and prose) or of the sweep tables."""
    rows = [json.loads(line) for line in (FIXTURE / "trials.jsonl").read_text().splitlines() if line.strip()]
    for r in rows:
        if "label" in r:
            r["label"] += "\n# Injected heading\n| a | b |"
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report"
    assert main_in_process("report", tmp_path, "--out", out) == 0
    from attnbench.report.run_files import write_run_files

    for md in [*out.glob("*.md"), *(p for p in write_run_files(tmp_path) if p.suffix == ".md")]:
        lines = md.read_text().splitlines()
        assert not [line for line in lines if line.startswith(("# Injected", "| a |"))], md


def test_a_report_of_several_results_paths_is_the_report_of_their_rows_together(tmp_path, capsys):
    """`report A B` reads both, as a report of a directory holding both does (the truth here);
    a file reached twice is read once; several paths have no one default report directory."""
    parent = tmp_path / "runs"
    one = parent / "one"
    one.mkdir(parents=True)
    (one / "trials.jsonl").write_bytes((FIXTURE / "trials.jsonl").read_bytes())
    second = other_machine(parent)
    assert main_in_process("report", parent, "--out", tmp_path / "together") == 0
    warned = capsys.readouterr().err  # the copy's rows repeat trial ids: each is counted once, and said
    inside = one / "trials.jsonl"  # a file of a directory given too
    assert main_in_process("report", one, second, one, inside, "--out", tmp_path / "apart") == 0
    assert capsys.readouterr().err == warned  # and nothing more: `one` was read once
    together, apart = snapshot(tmp_path / "together"), snapshot(tmp_path / "apart")
    assert set(together) == set(apart)
    for name in together:
        if name != "report.md":
            assert together[name] == apart[name], name
    text = apart["report.md"].decode()
    assert f"by `attnbench report {one} {second} {inside}`" in text  # the paths as given, each once
    strip = lambda md: [line for line in md.splitlines() if not line.startswith("Generated ")]  # noqa: E731
    assert strip(together["report.md"].decode()) == strip(text)
    capsys.readouterr()
    assert main_in_process("report", one, second) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--out DIR" in err
    assert not (one / "report").exists() and not (second / "report").exists()
