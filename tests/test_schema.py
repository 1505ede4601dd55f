"""The typed result rows: every committed result still loads, and a bad row names its field."""

import dataclasses
import json
from pathlib import Path

import pytest

from attnbench.results import convert, read_rows, schema
from attnbench.results.schema import (
    MaxSeqResult,
    SchemaError,
    Speedup,
    Trial,
    Verify,
    row_from_json,
)
from attnbench.results.series import relabel

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "results").rglob("trials.jsonl")) + sorted(
    (ROOT / "tests" / "fixtures").rglob("trials.jsonl")
)
FIXTURE = ROOT / "tests" / "fixtures" / "results" / "cpu-tiny" / "trials.jsonl"
GPU_RUN = ROOT / "results" / "2026-11-22-h200-default" / "trials.jsonl"


def lines(path):
    return [(i, json.loads(line)) for i, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]


def without_nulls(value):
    """The policy: a null optional field and an absent one mean the same (not recorded)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_committed_row_loads_through_the_types(path):
    rows = lines(path)
    assert rows
    for lineno, raw in rows:
        row = row_from_json(raw)
        assert isinstance(row, schema.KINDS[raw["kind"]]), f"{path}:{lineno}"
        assert row.extra == {}, f"{path}:{lineno}: keys the schema does not declare: {sorted(row.extra)}"
        assert without_nulls(row.to_json()) == without_nulls(raw), f"{path}:{lineno}"
        assert row_from_json(row.to_json()) == row
    read, problems = read_rows(path)
    assert problems == [] and len(read) == len(rows)


def test_typed_fields_hold_the_raw_values():
    raw = next(r for _, r in lines(GPU_RUN) if r["kind"] == "max-seq" and r["status"] == "ok")
    row = row_from_json(raw)
    assert isinstance(row, Trial)
    assert (row.impl, row.seq_len, row.times_ms, row.time_ms) == (
        raw["impl"],
        raw["seq_len"],
        raw["times_ms"],
        raw["time_ms"],
    )
    assert row.env.machine == raw["env"]["machine"]
    assert (
        [(g.index, g.max_memory_allocated) for g in row.gpus]
        == [(g["index"], g["max_memory_allocated"]) for g in raw["gpus"]]
        != []
    )


def test_every_kind_written_today_has_a_type():
    assert set(schema.KINDS) == {"max-seq", "points", "max-seq-result", "verify", "speedup"}
    assert {schema.KINDS[k] for k in schema.KINDS} == {Trial, MaxSeqResult, Verify, Speedup}


def a_verify_row():
    return next(r for _, r in lines(FIXTURE) if r["kind"] == "verify")


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("seq_len"), "verify row: missing field 'seq_len'"),
        (lambda r: r.update(seq_len="4096"), "verify row: field 'seq_len' is a string ('4096'), expected an integer"),
        (lambda r: r.update(seq_len=True), "field 'seq_len' is a boolean (True), expected an integer"),
        (lambda r: r.update(causal=None), "field 'causal' is null, expected true or false"),
        (lambda r: r.update(rel_err="small"), "field 'rel_err' is a string ('small'), expected a number"),
        (lambda r: r["env"].pop("machine"), "field 'env': missing field 'machine'"),
        (lambda r: r.update(schema=2), "field 'schema' is 2, this attnbench reads schema 1; upgrade attnbench"),
        (lambda r: r.pop("schema"), "missing field 'schema'"),
        (lambda r: r.update(kind="histogram"), "field 'kind' is 'histogram', expected one of"),
    ],
)
def test_a_bad_row_is_one_line_naming_the_field(change, message):
    row = a_verify_row()
    change(row)
    with pytest.raises(SchemaError) as err:
        row_from_json(row)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_row_read_holds_its_own_fields_and_reads_the_others_as_not_recorded():
    raw = next(r for _, r in lines(GPU_RUN) if r["kind"] == "max-seq" and r["status"] == "ok")
    row = row_from_json(raw)
    built = Trial(**{f.name: getattr(row, f.name) for f in dataclasses.fields(Trial)})
    assert row == built and row.predicted_only is None and row.extra == {}
    assert row_from_json(raw).extra is not row.extra  # a default made afresh for each row
    assert set(vars(row)) <= set(raw) | {"extra"}  # the fields it lacks are the class's defaults
    moved = relabel(row, "another", "another series")
    assert (moved.label, moved.series, row.label) == ("another", "another series", raw["label"])
    assert moved.times_ms == row.times_ms and moved.env is row.env and moved.to_json()["label"] == "another"
    moved.predicted_only = True  # set on the copy only
    assert row.predicted_only is None


def test_bad_nested_entry_is_named_by_position():
    raw = next(r for _, r in lines(GPU_RUN) if r["kind"] == "max-seq" and r["gpus"])
    raw["gpus"][0]["index"] = "zero"
    with pytest.raises(SchemaError, match=r"field 'gpus'\[0\]: field 'index' is a string"):
        row_from_json(raw)


def test_keys_added_later_are_kept_and_written_back():
    raw = {**a_verify_row(), "energy_j": 1.5}
    row = row_from_json(raw)
    assert row.extra == {"energy_j": 1.5}
    assert row.to_json()["energy_j"] == 1.5


def test_ints_are_numbers_and_null_means_not_recorded():
    raw = {**a_verify_row(), "rel_err": 0, "backend": None}
    row = row_from_json(raw)
    assert row.rel_err == 0.0 and isinstance(row.rel_err, float) and row.backend is None
    assert "backend" not in row.to_json()


def test_reader_skips_an_invalid_row_and_names_file_line_and_field(tmp_path):
    good = FIXTURE.read_text().splitlines(keepends=True)
    bad = {**json.loads(good[0]), "seq_len": "long"}
    path = tmp_path / "trials.jsonl"
    path.write_text(good[0] + json.dumps(bad) + "\n" + "".join(good[1:]))
    rows, problems = read_rows(path)
    assert len(rows) == len(good)
    why = f"{bad['kind']} row: field 'seq_len' is a string ('long'), expected an integer"
    assert problems == [f"{path}:2: invalid row skipped ({why})"]


def test_writer_refuses_a_row_that_breaks_the_schema(tmp_path):
    from attnbench.results import ResultsWriter

    row = a_verify_row()
    del row["status"]
    with pytest.raises(SchemaError, match="missing field 'status'"):
        ResultsWriter(tmp_path).append(row)
    assert not (tmp_path / "trials.jsonl").exists()


def test_the_typed_loader_names_each_rows_file_and_line():
    from attnbench.results import load_rows

    rows, problems = load_rows(FIXTURE)
    expected = [(i, d) for i, d in lines(FIXTURE) if d.get("kind") in schema.KINDS]
    assert problems == [] and len(rows) == len(expected)
    for row, (lineno, d) in zip(rows, expected):
        assert row.source == f"{FIXTURE}:{lineno}" and row.kind == d["kind"]


def test_a_workload_identity_is_every_workload_field_but_the_length():
    d = {"schema": 1, "kind": "verify", "run": "r", "impl": "sdpa", "config": {"backend": "auto"}, "batch": 1}
    d |= {"seq_len": 256, "heads": 2, "head_dim": 16, "dtype": "fp32", "device": "cpu", "causal": True}
    d |= {"status": "pass", "message": ""}
    row = row_from_json(d)
    ident = row.identity()
    assert ident == {k: d[k] for k in ("impl", "config", "batch", "seq_len", "heads", "head_dim", "dtype")} | {
        "device": "cpu",
        "causal": True,
        "mode": None,
        "world_size": 1,
        "strategy": "single",
    }
    other = row_from_json({**d, "seq_len": 512})
    assert other.identity_key() != row.identity_key() and other.identity_key(seq_len=False) == row.identity_key(False)


def test_every_stored_field_of_every_row_kind_is_in_the_results_format_doc():
    """The README promises that docs/reference/results-format.md names every field of every row: a field
    added to a row class without a word in that page fails here."""
    import dataclasses
    import re

    named = set(re.findall(r"`([a-z_0-9]+)`", (ROOT / "docs" / "reference" / "results-format.md").read_text()))
    missing = {
        cls.__name__: [
            f.name for f in dataclasses.fields(cls) if f.name not in named and f.name not in convert.row_own_fields(cls)
        ]
        for cls in schema.ROW_TYPES
    }
    assert missing == {cls.__name__: [] for cls in schema.ROW_TYPES}


# --- rows a writer joins from typed parts ------------------------------------------------------


def _measured(**fields):
    return schema.Measured(status="ok", message="", times_ms=[2.0, 4.0], **fields)


def test_a_row_joined_from_parts_reads_back_as_a_reader_finds_it():
    gpu = schema.GpuMemory(index=1, rank=1, max_memory_allocated=3 << 30, nvml_used_peak=4 << 30)
    part = _measured(time_ms=3.0, peak_over_floor=float("nan"), gpus=[gpu], sent_bytes=0)
    head = dict(
        kind="points", run="r", series="s", label="sdpa", impl="sdpa", config={}, batch=1, seq_len=1024, heads=8
    )
    head |= dict(head_dim=64, dtype="bf16", device="cuda", causal=False, memory_limit=None)
    row = schema.join(Trial, part, **head, time_ms=5.0, env={"machine": "gpu"})
    written = json.loads(json.dumps(row.to_json()))
    assert list(written)[:3] == ["schema", "kind", "run"] and list(written)[-1] == "env"
    again = row_from_json(written)
    assert again.gpus == [gpu]  # a nested record goes out as the object a reader checks
    assert again.time_ms == 5.0  # the writer's own field wins over the part's
    assert "peak_over_floor" in written and written["peak_over_floor"] is None  # NaN is not JSON
    assert written["memory_limit"] is None and written["sent_bytes"] == 0  # explicit null kept, zero is a value
    assert "time_iqr_ms" not in written  # what no part holds is not written


def test_a_part_a_worker_sent_reads_back_typed_and_a_bad_field_is_named():
    part = _measured(gpus=[schema.GpuMemory(index=0, max_memory_allocated=5)], compile_ms=1.5)
    sent = json.loads(json.dumps(convert.to_json(part)))
    assert schema.received(schema.Measured, sent, "the worker") == part
    with pytest.raises(SchemaError, match="'times_ms'"):
        schema.received(schema.Measured, {k: v for k, v in sent.items() if k != "times_ms"}, "the worker")
    with pytest.raises(SchemaError, match="'compile_ms'"):
        schema.received(schema.Measured, {**sent, "compile_ms": "slow"}, "the worker")
    with pytest.raises(SchemaError, match="unknown field 'speed'"):
        schema.received(schema.Measured, {**sent, "speed": 1}, "the worker")
    with pytest.raises(SchemaError, match="not a JSON object"):
        schema.received(schema.Measured, ["ok"], "the worker")
