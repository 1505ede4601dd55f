"""The training table from hand-made rows: a configuration's largest training length, its
peak over the training floor and useful TFLOP/s there and at 64K, beside its forward-only
largest length; a configuration measured only at 64K has that column alone."""

import json

from attnbench.report.run_files import write_run_files
from attnbench.report.tables.training import TrainingRecord, training_records, training_table

from conftest import typed_row


def typed(rows):
    return [typed_row(**r) for r in rows]


def sweep_markdown(rows, where):
    """The sweep.md a results directory of ``rows`` gets."""
    where.mkdir(exist_ok=True)
    (where / "trials.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in typed(rows)))
    write_run_files(where)
    return (where / "sweep.md").read_text()


def _trial(series, label, mode, kind, seq_len, status="ok", peak=None, tflops=None):
    # ten step times of 9.9-10.1 ms around a 10 ms median: TFLOP/s within 1% of `tflops`
    times = [10.0 + d / 100 for d in (-10, -8, -5, -2, 0, 0, 2, 5, 8, 10)] if status == "ok" else []
    return {
        "times_ms": times,
        "time_ms": 10.0 if times else None,
        "kind": kind,
        "series": series,
        "label": label,
        "impl": label.split("(")[0],
        "mode": mode,
        "seq_len": seq_len,
        "status": status,
        "dtype": "bf16",
        "device": "cuda",
        "batch": 1,
        "heads": 8,
        "head_dim": 64,
        "causal": False,
        "env": {"machine": "GPU x1"},
        "peak_over_floor": peak,
        "tflops_useful": tflops,
        "message": "out of memory" if status == "oom" else "",
    }


ROWS = [
    _trial("d-train", "dilated(a)", "fwd_bwd", "max-seq", 65536, peak=1.05, tflops=250.0),
    _trial("d-train", "dilated(a)", "fwd_bwd", "max-seq", 1 << 23, peak=1.03, tflops=280.0),
    _trial("d-train", "dilated(a)", "fwd_bwd", "max-seq", 1 << 24, status="oom"),
    _trial("d-fwd", "dilated(a)", "fwd", "max-seq", 1 << 25, peak=1.0, tflops=300.0),
    _trial("d-fwd", "dilated(a)", "fwd", "max-seq", 1 << 26, status="oom"),
    _trial("b-64k", "block-sparse(b)", "fwd_bwd", "points", 65536, peak=1.2, tflops=120.0),
]


def test_records_hold_the_largest_training_and_forward_lengths():
    dilated, block = training_records(typed(ROWS))
    at_max, at_64k = dilated.tflops_at_max, dilated.tflops_compare
    assert dilated == TrainingRecord(
        label="dilated(a)",
        dtype="bf16",
        machine="GPU x1",
        max_seq_len=1 << 23,
        memory_limit=0,  # the whole GPU
        peak_over_floor=1.03,
        tflops_at_max=at_max,
        tflops_compare=at_64k,
        fwd_max_seq_len=1 << 25,
        fwd_peak_over_floor=1.0,
    )
    assert (at_max.value, at_max.n, at_64k.value) == (280.0, 10, 250.0)
    # a rate is work over time: the slowest plausible median gives the low end
    assert 280.0 * 10.0 / 10.1 <= at_max.low < 280.0 < at_max.high <= 280.0 * 10.0 / 9.9
    assert block.max_seq_len is None and block.tflops_compare.value == 120.0 and block.fwd_max_seq_len is None


def test_sweep_markdown_has_the_training_table_only_with_training_rows(tmp_path):
    text = sweep_markdown(ROWS, tmp_path / "both")
    assert "## Training: forward plus backward" in text
    table = training_table(training_records(typed(ROWS))).markdown()
    assert table.splitlines()[2] in text
    assert "| dilated(a) | bf16 | GPU x1 | 8,388,608 (8M) | whole GPU | 1.03x | 280.0 ±" in table
    assert "(n=10) | 33,554,432 (32M) | 1.00x |" in table
    assert "| block-sparse(b) | bf16 | GPU x1 | - | - | - | - | 120.0 ±" in table
    forward = sweep_markdown([r for r in ROWS if r["mode"] == "fwd"], tmp_path / "forward")
    assert "Training: forward plus backward" not in forward


def test_training_points_at_other_lengths_make_no_record():
    assert training_records(typed([_trial("s", "sdpa()", "fwd_bwd", "points", 8192, peak=1.2, tflops=1.0)])) == []


def test_a_search_and_points_of_one_configuration_make_one_record():
    # gpu-fwd-bwd runs block-sparse's default pattern as a search and again as a 64K point:
    # two series under one label, whose points hold none of the search's lengths
    rows = [
        _trial("b-search", "block-sparse", "fwd_bwd", "max-seq", 1 << 20, peak=1.10, tflops=270.0),
        _trial("b-search", "block-sparse", "fwd_bwd", "max-seq", 1 << 21, status="oom"),
        _trial("b-points", "block-sparse", "fwd_bwd", "points", 65536, peak=1.14, tflops=300.0),
    ]
    (record,) = training_records(typed(rows))
    assert (record.max_seq_len, record.peak_over_floor, record.tflops_at_max.value) == (1 << 20, 1.10, 270.0)
    assert record.tflops_compare.value == 300.0


def test_a_search_joins_the_points_of_its_own_code_version():
    # the report labels a series measured by two commits with each commit ("@ c"); a search
    # measured by one keeps its plain label, and joins the points of its own commit only
    def by(commit, row, label=None):
        return {**row, "env": {**row["env"], "commit": commit}, "label": label or row["label"]}

    limited = {"memory_limit": 16 << 30}  # searched under an allocator limit
    rows = [
        by("new", {**_trial("b-search", "bs", "fwd_bwd", "max-seq", 1 << 21, peak=1.07, tflops=250.0), **limited}),
        by("new", {**_trial("b-search", "bs", "fwd_bwd", "max-seq", 1 << 22, status="oom"), **limited}),
        by(
            "old",
            _trial("b-points@old", "bs", "fwd_bwd", "points", 65536, tflops=200.0),
            "bs @ old (superseded by new)",
        ),
        by("new", _trial("b-points@new", "bs", "fwd_bwd", "points", 65536, tflops=240.0), "bs @ new"),
    ]
    new, old = sorted(training_records(typed(rows)), key=lambda r: r.label)
    assert (new.label, new.max_seq_len, new.tflops_compare.value) == ("bs @ new", 1 << 21, 240.0)
    assert new.memory_limit == 16 << 30 and old.memory_limit is None
    assert "| bs @ new | bf16 | GPU x1 | 2,097,152 (2M) | 16 GiB | 1.07x |" in training_table([new, old]).markdown()
    assert (old.label, old.max_seq_len, old.tflops_compare.value) == (
        "bs @ old (superseded by new)",
        None,
        200.0,
    )
