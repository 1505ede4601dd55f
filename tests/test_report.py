"""`attnbench report` and `attnbench predict` on result files that attnbench itself wrote.

The fixture ``tests/fixtures/results/cpu-tiny/trials.jsonl`` is the output of
``attnbench run --profile tests/fixtures/report-cpu.toml --out tests/fixtures/results/cpu-tiny``
on a CPU (see tests/fixtures/README.md). Every expected value below is computed here from the
fixture's rows with the definitions written out, not by calling the report's own code.
"""

from __future__ import annotations

import csv
import json
import re
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest

from attnbench.report.data import compact_label
from attnbench.units import format_bytes

from conftest import ROOT, run_cli, typed_row

pytestmark = pytest.mark.slow  # most tests read a report the module fixture writes with the real command

FIXTURE = ROOT / "tests" / "fixtures" / "results" / "cpu-tiny"
GIB = 2**30
# series whose memory holds N x N scores: the naive matmul + softmax, and sdpa's math backend
QUADRATIC = ("naive", "sdpa(backend=math)")
SEED_003_LABELS = [
    "Single segment, no dilation",
    "Single segment, dilation=2",
    "Multi-segment [512,1024]",
    "Three segments [512,1024,2048]",
]


# --- the fixture's rows, and what the report should say about them -------------------------------


def fixture_rows(path: Path = FIXTURE) -> list[dict]:
    return [json.loads(line) for line in (path / "trials.jsonl").read_text().splitlines() if line.strip()]


def max_seq_series(rows) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "max-seq":
            out.setdefault(r["series"], []).append(r)
    return out


def expected_largest(rows) -> dict[str, dict]:
    """Per max-seq series label: the largest successful length, what stopped the next one, peaks there."""
    out = {}
    finished = {r["series"] for r in rows if r.get("kind") == "max-seq-result"}
    for key, trials in max_seq_series(rows).items():
        ok = {r["seq_len"]: r for r in trials if r["status"] == "ok"}
        best = max(ok)
        failed = [r for r in trials if r["status"] != "ok" and r["seq_len"] > best]
        if key not in finished:  # an interrupted search: its largest length is only a lower bound
            stopped_by = "search interrupted"
        elif failed:
            stopped_by = {"oom": "memory", "time-limit": "time"}[min(failed, key=lambda r: r["seq_len"])["status"]]
        else:
            stopped_by = "max-seq-len cap"
        row = ok[best]
        out[compact_label(trials[0])] = {
            "max": best,
            "stopped_by": stopped_by,
            "peak": row["peak_bytes"],
            "per_token": row["peak_bytes"] / (row["batch"] * best),
            "ratio": row["peak_bytes"] / row["floor_bytes"],
            "inputs": row["inputs_bytes"],
            "tokens_per_s": row["tokens_per_s"],
            "ok": ok,
            "trials": trials,
        }
    return out


def series_points(rows) -> dict[str, list[tuple[int, int]]]:
    """(length, peak) of every successful trial, per label (max-seq and points)."""
    out: dict[str, list[tuple[int, int]]] = {}
    for r in rows:
        if r.get("kind") in ("max-seq", "points") and r["status"] == "ok":
            out.setdefault(compact_label(r), []).append((r["seq_len"], r["peak_bytes"]))
    return out


def least_squares(points, degree):
    """Normal equations, solved directly: coefficients a, b (, c) of a + b N (+ c N^2)."""
    n = np.array([p[0] for p in points], float)
    y = np.array([p[1] for p in points], float)
    X = np.vstack([n**k for k in range(degree + 1)]).T
    return np.linalg.solve(X.T @ X, X.T @ y)


def solve_for(coef, budget):
    if len(coef) == 2:
        return (budget - coef[0]) / coef[1]
    a, b, c = coef
    return (-b + np.sqrt(b * b - 4 * c * (a - budget))) / (2 * c)


# --- running the report ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    proc = run_cli("report", FIXTURE, "--out", out)  # the real command, once, in a fresh process
    assert proc.returncode == 0, proc.stderr
    return out, proc


def read_csv(out: Path, stem: str) -> list[dict]:
    matches = sorted((out / "csv").glob(f"{stem}-cpu-*.csv"))
    assert matches, f"no csv/{stem}-*.csv"
    with open(matches[0], newline="") as f:
        return list(csv.DictReader(f))


def section(md: str, title: str) -> str:
    """The text of the level-2 section whose heading starts with ``title``."""
    start = md.index(f"\n## {title}")
    end = md.find("\n## ", start + 1)
    return md[start : end if end > 0 else None]


def md_tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every markdown table in ``text`` as (headers, rows of cells)."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("| ") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            headers = [c.strip() for c in lines[i].strip("|").split(" | ")]
            body, i = [], i + 2
            while i < len(lines) and lines[i].startswith("| "):
                body.append([c.strip() for c in lines[i].strip().strip("|").split(" | ")])
                i += 1
            tables.append((headers, body))
        else:
            i += 1
    return tables


def md_table(text: str, first_header: str) -> tuple[list[str], list[list[str]]]:
    found = [t for t in md_tables(text) if t[0][0] == first_header]
    assert found, f"no table starting with {first_header!r}"
    return found[0]


def tokens_text(n: int) -> str:
    for suffix, size in (("M", 2**20), ("K", 2**10)):
        if n >= size:
            short = n / size
            return f"{n:,} ({short:.0f}{suffix})" if short == int(short) else f"{n:,} ({short:.1f}{suffix})"
    return f"{n:,}"


# --- the report as a whole -------------------------------------------------------------------------


def test_report_writes_markdown_csv_and_png_plots(report):
    out, proc = report
    md_path = out / "report.md"
    assert f"report: {md_path}" in proc.stdout.replace("\n", "")
    md = md_path.read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    # the answer's figure, and no speedup bars without speedup rows
    assert {re.sub(r"-cpu-.*", "", i) for i in images} == {"answer.png", "memory", "time", "tflops"}
    # a CPU run measures none of the seeds' GPU claims: their pages are left out
    assert not (out / "seeds.md").exists() and "seeds.md" not in md
    for image in images:
        data = (out / image).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    for ref in re.findall(r"`csv/([^`]+)`", md):
        assert list((out / "csv").glob(ref)), ref


def test_the_answer_first_then_sections_by_question_and_no_seeds_for_a_cpu_run(report):
    md = (report[0] / "report.md").read_text()
    titles = [line[3:] for line in md.splitlines() if line.startswith("## ")]
    assert titles[0] == "The answer: how long, how fast, how much memory" and "Against the seeds" not in titles
    for title in ("How long", "How fast", "Dilation", "Capacity", "Plots", "Environment and commands"):
        assert any(t.startswith(title) for t in titles), title
    # a CPU machine: no section about several GPUs, and its heading says what it is
    assert not any(t.startswith(("Data parallelism", "Sequence parallelism")) for t in titles)
    assert "### cpu: AMD EPYC (" in md and "no GPU)" in md


def test_a_section_without_rows_is_only_named_with_the_command_that_produces_it(report):
    md = (report[0] / "report.md").read_text()
    titles = [line[3:] for line in md.splitlines() if line.startswith("## ")]
    assert not any(t.startswith("Training") for t in titles)  # the fixture has no training trial
    unmeasured = section(md, "Not measured here")
    # a CPU machine is sent to the CPU twin of the GPU profile
    assert (
        "- Training: forward plus backward: _No data: no forward-plus-backward trials. "
        "`attnbench run --profile models-cpu` produces it._ (on cpu: AMD EPYC)"
    ) in unmeasured


# --- executive summary ------------------------------------------------------------------------------


def short(n: int) -> str:
    """64K, 1.5M: binary multiples, one decimal where not whole."""
    for suffix, size in (("M", 2**20), ("K", 2**10)):
        if n >= size:
            return (f"{n / size:.0f}" if n % size == 0 else f"{n / size:.1f}") + suffix
    return str(n)


def test_the_answer_table_is_within_the_first_40_lines_and_matches_the_rows(report):
    out, _ = report
    rows = fixture_rows()
    expect = expected_largest(rows)
    md = (out / "report.md").read_text()
    first = "\n".join(md.splitlines()[:40])
    headers, body = md_table(first, "Configuration")
    assert headers[:6] == ["Configuration", "Settings", "Longest forward", "Stopped by", "Per token", "Peak/floor"]
    assert {row[0] for row in body} == set(expect)
    (limit,) = {r["memory_limit"] for r in rows if r.get("kind") == "max-seq"}
    (call_seconds,) = {r["max_trial_seconds"] for r in rows if r.get("kind") == "max-seq"}
    for row in body:
        e = expect[row[0]]
        failed = min(r["seq_len"] for r in e["trials"] if r["status"] != "ok" and r["seq_len"] > e["max"])
        assert row[2] == f"{short(e['max'])} – {short(failed)}"
        # a stop names the one limit of its cause: memory its memory limit, time a call's time limit
        cause = f"{limit // 2**20} MiB limit" if e["stopped_by"] == "memory" else f"{call_seconds:g} s a call"
        assert row[3] == f"{e['stopped_by']} ({cause})"
        assert row[4] == format_bytes(e["per_token"]) and row[5] == f"{e['ratio']:.2f}x"
    for rec in read_csv(out, "answer"):
        e = expect[rec["Configuration"]]
        assert int(rec["Forward Longest"]) == e["max"] and int(rec["GPUs"]) == 1
        assert float(rec["Forward Peak per GPU"]) == e["peak"]
        assert float(rec["Forward Peak / Floor"]) == pytest.approx(e["ratio"], rel=1e-12)
    assert all(len(line) <= 200 for line in md.splitlines()[:60])


def test_environment_and_the_exact_commands(report):
    out, _ = report
    rows = fixture_rows()
    env = rows[0]["env"]
    text = section((out / "report.md").read_text(), "Environment and commands")
    _, body = md_table(text, "Item")
    items = dict((k, v) for k, v in body)
    assert items["torch"] == env["torch"] and items["attnbench commit"] == env["commit"]
    assert items["GPUs"] == "none" and items["Python"] == env["python"]
    # argv[0] was the module's path; the report shows the command as a user types it
    command = "attnbench " + env["command"].split(" ", 1)[1]
    assert command == "attnbench run --profile tests/fixtures/report-cpu.toml --out tests/fixtures/results/cpu-tiny"
    cmds = read_csv(out, "commands")
    assert cmds == [{"Run": "cpu-tiny", "Commit": env["commit"][:9], "Command": command, "Rows": str(len(rows))}]
    verify = [r for r in rows if r["kind"] == "verify"]
    _, checks = md_table(text, "Implementation")
    assert len(checks) == len(verify) and all(c[-1] == "pass" for c in checks)


# --- report 002 ----------------------------------------------------------------------------------


def test_every_search_has_its_table_of_trials(report):
    out, _ = report
    expect = expected_largest(fixture_rows())
    text = section((out / "report.md").read_text(), "How long")
    for label, e in expect.items():
        part = text[text.index(f"##### {label}:") :]
        headers, body = md_table(part, "Sequence Length")
        assert headers == ["Sequence Length", "Memory After QKV", "Peak Memory", "Result", "Notes"]
        trials = sorted(e["trials"], key=lambda r: r["seq_len"])
        assert [row[0] for row in body] == [tokens_text(r["seq_len"]) for r in trials]
        status = {"ok": "✓ Success", "oom": "✗ OOM", "time-limit": "✗ Time limit"}
        assert [row[3] for row in body] == [status[r["status"]] for r in trials]
        assert [row[2] for row in body if row[3] == "✓ Success"] == [
            format_bytes(r["peak_bytes"]) for r in trials if r["status"] == "ok"
        ]


def test_fixed_length_measurements(report):
    out, _ = report
    points = sorted((r for r in fixture_rows() if r.get("kind") == "points"), key=lambda r: r["seq_len"])
    text = section((out / "report.md").read_text(), "How fast")
    part = text[text.index("#### Each series") :]
    headers, body = md_table(part[part.index(f"##### {points[0]['label']}:") :], "Sequence Length")
    assert headers == ["Sequence Length", "Eager Time", "GPU Time", "Peak Memory", "Result", "Sparsity"]
    assert [[row[0], row[2], row[3], row[4], row[5]] for row in body] == [
        [tokens_text(r["seq_len"]), "-", format_bytes(r["peak_bytes"]), "✓ Success", "Dense"] for r in points
    ]
    # eager time: the median of the raw samples, ± its interval, and how many samples
    for row, r in zip(body, points):
        assert row[1].startswith(f"{statistics.median(r['times_ms']):,.3g} ms ±"), row[1]
        assert row[1].endswith(f"(n={len(r['times_ms'])})"), row[1]


def test_memory_at_the_longest_sequence(report):
    out, _ = report
    expect = expected_largest(fixture_rows())
    recs = read_csv(out, "memory-at-longest")
    assert list(recs[0]) == [
        "Implementation",
        "GPUs",
        "Sequence Length",
        "Input Tensors (QKV)",
        "Peak Memory",
        "Memory per Token",
        "Peak / Floor",
    ]
    assert {r["Implementation"] for r in recs} == set(expect)
    for r in recs:
        e = expect[r["Implementation"]]
        assert int(r["Sequence Length"]) == e["max"] and int(r["Input Tensors (QKV)"]) == e["inputs"]
        assert int(r["Peak Memory"]) == e["peak"]
        assert float(r["Memory per Token"]) == pytest.approx(e["per_token"], rel=1e-12)


# --- report 003 ----------------------------------------------------------------------------------


def test_dilation_configuration_table_and_dilation_impact(report):
    out, _ = report
    expect = expected_largest(fixture_rows())
    text = section((out / "report.md").read_text(), "Dilation")
    tables = [t for t in md_tables(text) if t[0][0] == "Configuration"]
    assert all(
        t[0] == ["Configuration", "Max Tokens", "Memory", "Throughput", "Dilation Impact", "Stopped By"] for t in tables
    )
    seed_table = next(t for t in tables if t[1][0][0] == SEED_003_LABELS[0])
    assert [row[0] for row in seed_table[1]] == SEED_003_LABELS
    # Dilation Impact: tokens/s against the baseline at the longest length all four ran
    common = max(set.intersection(*(set(expect[label]["ok"]) for label in SEED_003_LABELS)))
    base = expect[SEED_003_LABELS[0]]["ok"][common]["tokens_per_s"]
    recs = {}
    for path in (out / "csv").glob("dilation-configurations-*.csv"):
        recs.update({r["Configuration"]: r for r in csv.DictReader(open(path, newline=""))})
    for label in SEED_003_LABELS:
        e, r = expect[label], recs[label]
        assert int(r["Max Tokens"]) == e["max"] and int(r["Memory"]) == e["peak"]
        assert float(r["Throughput"]) == pytest.approx(e["tokens_per_s"], rel=1e-12)
        assert float(r["Dilation Impact"]) == pytest.approx(e["ok"][common]["tokens_per_s"] / base, rel=1e-12)
        assert r["Stopped By"] == e["stopped_by"]
    assert f"at N={common:,}, the longest length every configuration ran" in text


# --- capacity prediction ------------------------------------------------------------------------------


def test_capacity_fit_and_predictions_follow_the_least_squares_fit(report):
    out, _ = report
    rows = fixture_rows()
    expect = expected_largest(rows)
    points = series_points(rows)
    (limit,) = {r["memory_limit"] for r in rows if r.get("kind") in ("max-seq", "points")}
    fits = {r["Implementation"]: r for r in read_csv(out, "capacity-fit")}
    here = {r["Implementation"]: r for r in read_csv(out, "capacity-measured")}
    # a fit predicts for the device it was measured on only: no table of other GPU sizes
    assert not list((out / "csv").glob("capacity-gpus-*.csv"))
    # every series with enough successful lengths for its model (points series included)
    fitted = {label for label, pts in points.items() if len({n for n, _ in pts}) >= (3 if label in QUADRATIC else 2)}
    assert set(fits) == fitted and "sdpa(backend=math)" not in fitted
    assert "sdpa(backend=math) (2 of 3)" in section((out / "report.md").read_text(), "Capacity")
    assert list(next(iter(fits.values()))) == [
        "Implementation",
        "Dtype",
        "Model",
        "Successful Trials",
        "Max Fit Error",
        "Fit Error at Largest N",
    ]
    assert list(next(iter(here.values()))) == [
        "Implementation",
        "Device Memory",
        "Set Aside",
        "Budget",
        "Predicted Max",
        "Measured Max",
        "Stopped By",
        "Prediction Error",
        "Within 5%",
        "Note",
    ]
    for label, pts in points.items():
        if label not in fitted:
            continue
        degree = 2 if label in QUADRATIC else 1
        coef = least_squares(pts, degree)
        fit = fits[label]
        assert fit["Model"].startswith("quadratic" if degree == 2 else "linear")
        assert int(fit["Successful Trials"]) == len(pts)
        rel = [sum(c * n**k for k, c in enumerate(coef)) / y - 1 for n, y in pts]
        assert float(fit["Max Fit Error"]) == pytest.approx(max(map(abs, rel)), rel=1e-6, abs=1e-9)
        # CPU: the budget is the trial's memory limit, nothing set aside
        on = here[label]
        assert float(on["Budget"]) == limit and float(on["Set Aside"]) == 0
        predicted = solve_for(coef, limit)
        assert float(on["Predicted Max"]) == pytest.approx(predicted, rel=1e-6)
        if label in expect:
            assert int(on["Measured Max"]) == expect[label]["max"] and on["Stopped By"] == expect[label]["stopped_by"]
            if expect[label]["stopped_by"] == "memory":
                assert float(on["Prediction Error"]) == pytest.approx(predicted / expect[label]["max"] - 1, rel=1e-6)
                # a miss beyond 5% says so beside it, with its likely cause
                missed = abs(predicted / expect[label]["max"] - 1) > 0.05
                assert (
                    on["Note"].startswith("predicted high" if predicted > expect[label]["max"] else "predicted low")
                    if missed
                    else on["Note"] == ""
                )
            else:
                assert on["Prediction Error"] == ""
        assert on["Within 5%"] == ""  # the target is for GPU runs; a CPU run does not claim it


# --- bad input and mixed machines ---------------------------------------------------------------------


def test_missing_or_empty_results_are_one_line_errors_and_write_nothing(tmp_path, in_process):
    out = tmp_path / "out"
    missing = in_process("report", tmp_path / "nope", "--out", out)
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "does not exist" in missing.stderr
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    (tmp_path / "empty").mkdir()
    empty = in_process("report", tmp_path / "empty", "--out", out)
    assert empty.returncode == 2 and "no trials.jsonl under" in empty.stderr and "attnbench run" in empty.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "trials.jsonl").write_text('not json\n{"a": \n')
    junk = in_process("report", tmp_path / "junk", "--out", out)
    assert junk.returncode == 2 and "no readable result rows" in junk.stderr
    assert not out.exists()


def test_a_corrupt_line_is_reported_with_file_and_line_and_the_rest_used(tmp_path, report, in_process):
    lines = (FIXTURE / "trials.jsonl").read_text().splitlines(keepends=True)
    bad = tmp_path / "run" / "trials.jsonl"
    bad.parent.mkdir()
    bad.write_text("".join(lines[:20]) + '{"kind": "max-seq", "seq_len": 12\n' + "".join(lines[20:]))
    proc = in_process("report", bad.parent, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    assert f"warning: {bad}:21: unreadable line skipped" in proc.stderr.replace("\n", "")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "1 unreadable lines were skipped" in md and f"{bad}:21:" in md
    assert read_csv(tmp_path / "out", "answer") == read_csv(report[0], "answer")


def test_mixed_machines_are_reported_apart_never_combined(tmp_path, in_process):
    """A second machine's rows: the fixture's rows relabelled, keeping only trials up to 64K,
    so that combining the two machines would change every maximum."""
    rows = fixture_rows()
    (tmp_path / "a").mkdir()
    shutil.copy(FIXTURE / "trials.jsonl", tmp_path / "a" / "trials.jsonl")
    other = []
    for r in rows:
        if r.get("kind") in ("max-seq", "points") and r["seq_len"] > 65536 or r.get("kind") == "max-seq-result":
            continue
        other.append({**r, "env": {**r["env"], "machine": "cpu: second host", "hostname": "second"}})
        if "trial" in r:  # another machine's run has trials of its own
            other[-1]["trial"] = r["trial"] + "-second"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in other))
    proc = in_process("report", tmp_path, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "out" / "report.md").read_text()
    for title in ("The answer", "How long", "Capacity"):
        text = section(md, title)
        assert "### cpu: AMD EPYC" in text and "### cpu: second host" in text
    # both machines answer within the first 40 lines
    assert "### cpu: second host" in "\n".join(md.splitlines()[:40])
    first = {r["Configuration"]: r for r in csv.DictReader(open(tmp_path / "out" / "csv" / "answer-cpu-amd-epyc.csv"))}
    second = {
        r["Configuration"]: r for r in csv.DictReader(open(tmp_path / "out" / "csv" / "answer-cpu-second-host.csv"))
    }
    expect_a, expect_b = expected_largest(rows), expected_largest(other)
    for label in expect_a:
        assert int(first[label]["Forward Longest"]) == expect_a[label]["max"]
        assert int(second[label]["Forward Longest"]) == expect_b[label]["max"]
    assert (
        int(second["Single segment, no dilation"]["Forward Longest"])
        == 65536
        < int(first["Single segment, no dilation"]["Forward Longest"])
    )
    assert second["Single segment, no dilation"]["Forward Stopped By"] == "search interrupted"
    # an unfinished search is a lower bound: the answer says so
    answer = section(md, "The answer").split("### cpu: second host")[1]
    assert "| Single segment, no dilation | fp32 H4 D16 | ≥ 64K | search interrupted |" in answer
    env_b = dict(md_table(section(md, "Environment and commands").split("### cpu: second host")[1], "Item")[1])
    assert env_b["Host"] == "second"


# --- attnbench predict ----------------------------------------------------------------------------------


def test_predict_prints_one_prediction_per_series(tmp_path, in_process):
    label = "Multi-segment [512,1024]"
    proc = in_process("predict", "--impl", "dilated", "--gpu-memory", "1GiB", "--from", FIXTURE, "--label", label)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(label)
    coef = least_squares(series_points(fixture_rows())[label], 1)
    assert f"about {tokens_text(int(solve_for(coef, GIB)))} tokens on 1GiB" in lines[0]
    every = in_process("predict", "--impl", "dilated", "--gpu-memory", "80GiB", "--from", FIXTURE)
    assert every.returncode == 0 and len(every.stdout.strip().splitlines()) == 5  # five dilated series


def test_predict_from_several_results_paths_reads_their_rows_together(tmp_path, in_process):
    """The fixture's series split over two directories: `--from A --from B` predicts what `--from`
    the whole fixture does (the truth), series by series."""
    lines = (FIXTURE / "trials.jsonl").read_text().splitlines(keepends=True)
    halves = {"a": [], "b": []}
    for line in lines:
        series = json.loads(line).get("series") or ""
        halves["b" if series[-1:] in "02468ace" and series else "a"].append(line)
    for name, part in halves.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "trials.jsonl").write_text("".join(part))
    assert all(halves.values())
    whole = in_process("predict", "--impl", "dilated", "--gpu-memory", "80GiB", "--from", FIXTURE)
    both = in_process(
        "predict", "--impl", "dilated", "--gpu-memory", "80GiB", "--from", tmp_path / "a", "--from", tmp_path / "b"
    )
    assert both.returncode == 0, both.stderr
    assert sorted(both.stdout.splitlines()) == sorted(whole.stdout.splitlines()) and len(both.stdout.splitlines()) == 5


def test_predict_warns_of_a_cpu_fit_and_of_a_length_far_past_the_measured_ones(in_process):
    label = "Multi-segment [512,1024]"
    ok_rows = [r for r in fixture_rows() if r.get("label") == label and r.get("status") == "ok" and r.get("peak_bytes")]
    longest = max(r["seq_len"] for r in ok_rows)
    far = in_process("predict", "--impl", "dilated", "--gpu-memory", "80GiB", "--from", FIXTURE, "--label", label)
    near = in_process("predict", "--impl", "naive", "--gpu-memory", "256MiB", "--from", FIXTURE)
    for proc in (far, near):  # the prediction is still printed, one warning line beside it
        assert proc.returncode == 0 and "tokens on" in proc.stdout, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith("warning: ")
        assert "CPU resident memory" in proc.stderr and "on cpu" in proc.stderr
    predicted = int(re.search(r"about ([\d,]+)", far.stdout).group(1).replace(",", ""))
    assert predicted > 16 * longest and f"measured up to {tokens_text(longest)} tokens" in far.stderr
    assert f"{predicted / longest:,.0f}x beyond" in far.stderr and "beyond" not in near.stderr


def test_predict_says_in_words_when_its_fit_misses_a_measured_peak_by_more_than_a_fifth(tmp_path):
    """Peaks of 1, 1 and 4 MiB at 1K, 2K and 3K tokens: the least-squares line through them is
    0.5, 2 and 3.5 MiB (slope 1.5 MiB per 1K, through the means 2K and 2 MiB), 100% over the
    peak at 2K. A series on one line gets no such warning."""
    from attnbench.cli.predict import predict_lines

    def rows(label, peaks_mib):
        return [
            typed_row(
                "max-seq", series=label, label=label, impl="dilated", device="cpu", seq_len=n, peak_bytes=p * 2**20
            )
            for n, p in zip((1024, 2048, 3072), peaks_mib)
        ]

    (tmp_path / "trials.jsonl").write_text(
        "".join(json.dumps(r.to_json()) + "\n" for r in rows("bent", (1, 1, 4)) + rows("straight", (1, 2, 3)))
    )
    bent = predict_lines("dilated", "8MiB", tmp_path, "bent")
    warned = [line for line in bent if "not trustworthy" in line]
    assert len(warned) == 1 and "the linear fit misses the peak measured at 2,048 (2K) tokens by 100%" in warned[0]
    assert "more than 20%" in warned[0] and warned[0].startswith("warning: bent: ")
    assert not any("not trustworthy" in line for line in predict_lines("dilated", "8MiB", tmp_path, "straight"))


def test_predict_without_a_matching_series_says_what_the_results_hold(in_process):
    trial_rows = [r for r in fixture_rows() if r["kind"] in ("points", "max-seq")]
    wrong_label = in_process("predict", "--impl", "dilated", "--gpu-memory", "80GiB", "--from", FIXTURE, "--label", "x")
    absent = in_process("predict", "--impl", "flex", "--gpu-memory", "80GiB", "--from", FIXTURE)
    for proc in (wrong_label, absent):
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "enough successful trials" not in proc.stderr  # none matched: too few trials is not why
    labels = re.findall(r"'([^']+)'", wrong_label.stderr.split("its labels are")[1])
    assert len(labels) == len({r["series"] for r in trial_rows if r["impl"] == "dilated"}), wrong_label.stderr
    named = in_process(
        "predict", "--impl", "dilated", "--gpu-memory", "80GiB", "--from", FIXTURE, "--label", labels[-1]
    )
    assert named.returncode == 0, named.stderr  # a label it lists is one --label takes
    assert "no series of flex" in absent.stderr
    assert all(impl in absent.stderr for impl in {r["impl"] for r in trial_rows})


def test_predict_reads_its_implementation_alone(tmp_path, in_process):
    """A history holding rows of another implementation that no reader could use (one of
    another schema version, which stops a whole read) predicts what it predicts without them:
    predict decodes every line but types and judges its own implementation's rows only."""
    naive = next(r for r in fixture_rows() if r["impl"] == "naive")
    (tmp_path / "trials.jsonl").write_text(
        (FIXTURE / "trials.jsonl").read_text() + json.dumps({**naive, "schema": 999, "trial": "x"}) + "\n"
    )
    clean = in_process("predict", "--impl", "dilated", "--gpu-memory", "80GiB", "--from", FIXTURE)
    mixed = in_process("predict", "--impl", "dilated", "--gpu-memory", "80GiB", "--from", tmp_path)
    assert mixed.returncode == clean.returncode == 0, mixed.stderr
    assert mixed.stdout == clean.stdout and len(clean.stdout.splitlines()) == 5
    whole = in_process("predict", "--impl", "naive", "--gpu-memory", "80GiB", "--from", tmp_path)
    assert whole.returncode == 2 and "result schema 999" in whole.stderr  # naive's own rows: read and refused


def test_predict_bad_input(tmp_path, in_process):
    unknown = in_process("predict", "--impl", "nosuch", "--gpu-memory", "80GiB", "--from", FIXTURE)
    assert unknown.returncode == 2 and unknown.stderr.startswith("error: unknown implementation 'nosuch'")
    size = in_process("predict", "--impl", "naive", "--gpu-memory", "lots", "--from", FIXTURE)
    assert size.returncode == 2 and "cannot read memory size" in size.stderr
    only_verify = tmp_path / "v" / "trials.jsonl"
    only_verify.parent.mkdir()
    only_verify.write_text("".join(json.dumps(r) + "\n" for r in fixture_rows() if r["kind"] == "verify"))
    nodata = in_process("predict", "--impl", "naive", "--gpu-memory", "80GiB", "--from", only_verify.parent)
    assert (
        nodata.returncode == 2
        and "no series of naive" in nodata.stderr
        and "attnbench max-seq --impl naive" in nodata.stderr
    )
    for proc in (unknown, size, nodata):
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_make_report_runs_the_sweep_then_the_report_on_it():
    proc = __import__("subprocess").run(
        ["make", "-n", "report", "OUT=results/x"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    run = next(i for i, line in enumerate(lines) if "attnbench run --profile auto --out results/x" in line)
    assert "attnbench report results/x" in lines[run + 1]


def test_sparsity_keeps_two_significant_digits_of_the_kept_share():
    from attnbench.units import format_sparsity as sparsity_text

    # dilated [2048, 4096] / [1, 2] at 4M keeps ~0.07% of pairs: not "100.0% sparse"
    assert sparsity_text(0.00073) == "99.927% sparse"
    assert sparsity_text(0.05) == "95.0% sparse"
    assert sparsity_text(0.25, causal=True) == "50.0% sparse"
    assert sparsity_text(1.0) == "Dense"


def test_a_block_sparse_search_is_no_dilated_configuration(tmp_path, in_process):
    """block-sparse rows carry dilation_rates (None unless dilated_sparse sets them): the report
    must neither crash on them nor put them in report 003's dilated configuration table."""
    run = tmp_path / "bs"
    made = in_process(
        "max-seq",
        "--impl",
        "block-sparse",
        "--param",
        "block_size=16",
        "--param",
        "sparsity_ratio=0.25",
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--heads",
        "2",
        "--head-dim",
        "16",
        "--start",
        "256",
        "--max-seq-len",
        "1024",
        "--in-process",
        "--out",
        run,
    )
    assert made.returncode == 0, made.stderr
    done = in_process("report", run, "--out", tmp_path / "report")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    # no dilated row: the dilation section (a seed's workload) is left out, not filled with block-sparse
    assert "## Dilation" not in text and "block-sparse" in text


def test_a_series_measured_by_two_commits_stays_two_series(tmp_path, in_process):
    """Before-and-after runs in one results tree: never pooled into one search or one table."""
    rows = fixture_rows()
    searched = next(r["series"] for r in rows if r.get("kind") == "max-seq")
    mine = [r for r in rows if r.get("series") == searched]
    again = json.loads(json.dumps(mine))
    for r in again:
        r["env"]["commit"] = "f" * 40
        r["run"] = "rerun"
        if "trial" in r:  # a rerun's trials are trials of their own
            r["trial"] += "-rerun"
    for name, part in (("a", mine), ("b", again)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in part))
    done = in_process("report", tmp_path, "--out", tmp_path / "report")
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "report" / "report.md").read_text()
    label = compact_label(mine[0])
    old, new = f"{label} @ {mine[0]['env']['commit'][:9]}", f"{label} @ fffffffff"
    largest = text.split("## How long")[1].split("\n## ")[0]
    assert old in largest and new in largest
    # the answer shows the newest version alone, without the commit its label carries below
    answer = text.split("## The answer")[1].split("\n## ")[0]
    assert label in answer and old not in answer and new not in answer
    trials_per_table = len([r for r in mine if r.get("kind") == "max-seq"])
    for heading in (old, new):  # each search's own table, with its own trials only
        section = text.split(f"##### {heading}:")[1].split("\n#")[0]
        assert (
            len(
                [
                    line
                    for line in section.splitlines()
                    if line.startswith("| ") and "Sequence Length" not in line and not line.startswith("|---")
                ]
            )
            == trials_per_table
        )


@pytest.mark.parametrize("producer", sorted(__import__("attnbench.report.document", fromlist=["PRODUCERS"]).PRODUCERS))
def test_every_command_the_report_names_for_missing_data_parses(producer):
    """A reader copies these commands: each must name a real command and real options."""
    import shlex

    import typer

    from attnbench.cli import app
    from attnbench.report.document import PRODUCERS

    words = shlex.split(PRODUCERS[producer])
    assert words[0] == "attnbench"
    command = typer.main.get_command(app).commands[words[1]]
    command.make_context(words[1], words[2:])  # raises on an unknown option or a missing value


def test_a_search_under_a_memory_limit_is_its_own_series():
    # rows written with one series key for a search on the whole GPU and one under 4 GiB
    from attnbench.results.series import separate_memory_limits

    def row(run, kind, seq_len, limit=None):
        return typed_row(
            kind=kind,
            run=run,
            series="s1",
            label="naive",
            impl="naive",
            seq_len=seq_len,
            **({"memory_limit": limit} if limit else {}),
        )

    rows = [
        row("whole", "max-seq", 65536),
        row("whole", "max-seq-result", 65536),
        row("capped", "max-seq", 10240, 4 << 30),
        row("capped", "max-seq-result", 10240),
    ]
    whole, whole_result, capped, capped_result = separate_memory_limits(rows)
    assert (whole.series, whole.label) == (whole_result.series, whole_result.label) == ("s1", "naive")
    assert capped.series == capped_result.series != "s1"
    assert capped.label == capped_result.label == "naive under 4 GiB"


def test_allocator_limits_read_as_profiles_write_them():
    from attnbench.units import format_gib, parse_bytes

    assert [format_gib(parse_bytes(t)) for t in ("4GiB", "16GiB", "100MiB", "1.5GiB")] == [
        "4 GiB",
        "16 GiB",
        "100 MiB",
        "1.5 GiB",
    ]


def test_a_model_preset_label_is_compacted_like_any_other():
    row = {
        "impl": "dilated",
        "label": "dilated(segment_lengths=2048,4096, dilation_rates=1,2) for llama3-8b",
        "config": {"segment_lengths": [2048, 4096], "dilation_rates": [1, 2]},
    }
    assert compact_label(row) == "dilated[2048,4096/1,2] for llama3-8b"
    sdpa = {"impl": "sdpa", "label": "sdpa(backend=cudnn) for llama3-8b", "config": {"backend": "cudnn"}}
    assert compact_label(sdpa) == "sdpa(backend=cudnn) for llama3-8b"


def test_a_missing_table_names_the_command_for_the_machine_it_is_about():
    from attnbench.report.document import Doc

    gpu, cpu = Doc(), Doc()
    cpu.on_cpu = True
    for doc in (gpu, cpu):
        doc.missing("no fixed-length measurements on this machine", "points")
        doc.missing("no speedup rows on this machine", "speedup")
    assert "`attnbench run --profile auto`" in gpu.text() and "--gpus 2`" in gpu.text()
    assert (
        "`attnbench run --profile models-cpu`" in cpu.text() and "`attnbench run --profile multi-gpu-cpu`" in cpu.text()
    )


@pytest.mark.parametrize("tflops, shown", [(0.0123, "12.3 GFLOP/s"), (312.44, "312.4 TFLOP/s")])
def test_a_trials_notes_give_its_rate_in_the_unit_it_reads_in(tflops, shown):
    """A CPU's rate under one TFLOP/s is not printed as 0.0 TFLOP/s."""
    from attnbench.report.tables.sweep import memory_table

    row = typed_row(kind="max-seq", seq_len=2048, peak_over_floor=2.0, tflops_executed=tflops)
    assert f"peak 2.00x floor; {shown}" in memory_table([row])


def test_a_search_lists_each_length_once_and_says_which_a_fresh_process_confirmed():
    """A confirmation re-runs the longest length that ran: the table marks that row instead of
    repeating it; a confirmation that failed is a row of its own."""
    from attnbench.report.tables.sweep import memory_table

    def step(n, phase, status="ok"):
        return typed_row(kind="max-seq", seq_len=n, phase=phase, status=status, peak_bytes=n)

    ran = [step(1024, "grow"), step(3072, "predict"), step(4096, "bracket", "oom"), step(3072, "confirm")]
    lines = [line for line in memory_table(ran).splitlines() if line.startswith("| ")][1:]
    assert [line.split(" | ")[0] for line in lines] == ["| 1,024 (1K)", "| 3,072 (3K)", "| 4,096 (4K)"]
    assert "confirmed in a fresh process" in lines[1] and "confirmed" not in lines[0]
    failed = [step(1024, "grow"), step(3072, "predict"), step(3072, "confirm", "oom")]
    assert len([line for line in memory_table(failed).splitlines() if line.startswith("| 3,072")]) == 2
