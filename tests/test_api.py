"""attnbench.load / load_frame against the raw JSON of committed result directories."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

import attnbench
from attnbench.errors import AttnbenchError
from attnbench.results.schema import MaxSeqResult, Trial, Verify

ROOT = Path(__file__).resolve().parents[1]
RING = ROOT / "results" / "2026-11-22-h200x2-ring-max-seq"  # two GPUs: per-GPU memory in every trial
SINGLE = ROOT / "results" / "2026-11-22-h200-default"


def raw_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "trials.jsonl").read_text().splitlines() if line.strip()]


def same(a, b) -> bool:
    return (a is None and (b is None or (isinstance(b, float) and math.isnan(b)))) or a == b


def test_load_types_every_row_in_file_order():
    raw = raw_rows(RING)
    rows = attnbench.load(RING)
    assert [r.kind for r in rows] == [r["kind"] for r in raw]
    kinds = {"max-seq": Trial, "points": Trial, "verify": Verify, "max-seq-result": MaxSeqResult}
    for line, (row, d) in enumerate(zip(rows, raw), 1):
        assert type(row) is kinds[d["kind"]]
        assert (row.impl, row.seq_len, row.env.machine) == (d["impl"], d["seq_len"], d["env"]["machine"])
        assert row.source == f"{RING / 'trials.jsonl'}:{line}"


def test_frame_has_a_column_per_field_and_per_gpu_memory():
    raw = raw_rows(RING)
    df = attnbench.load_frame(RING)
    assert len(df) == len(raw)
    for cls in (Trial, Verify, MaxSeqResult):
        names = {f.name for f in dataclasses.fields(cls)} - {"env", "gpus", "extra"}
        assert names <= set(df.columns), names - set(df.columns)
    trials = [(i, d) for i, d in enumerate(raw) if d["kind"] == "max-seq" and d.get("gpus")]
    assert trials and max(len(d["gpus"]) for _, d in trials) == 2
    for i, d in trials:
        for key in ("time_ms", "peak_bytes", "status", "series", "tokens_per_s"):
            assert same(d.get(key), df.loc[i, key]), (i, key)
        assert df.loc[i, "env.machine"] == d["env"]["machine"]
        assert df.loc[i, "env.commit"] == d["env"]["commit"]
        assert df.loc[i, "times_ms"] == d["times_ms"]
        for g, gpu in enumerate(d["gpus"]):
            for key in ("max_memory_allocated", "max_memory_reserved", "nvml_used_peak"):
                assert same(gpu.get(key), df.loc[i, f"gpu{g}.{key}"]), (i, g, key)


def test_frame_of_several_directories_is_their_rows_together():
    both = attnbench.load_frame(RING, [SINGLE])
    assert len(both) == len(raw_rows(RING)) + len(raw_rows(SINGLE))
    assert set(both["env.machine"]) == {d["env"]["machine"] for d in raw_rows(RING) + raw_rows(SINGLE)}
    ok = both[(both["kind"] == "max-seq") & (both["status"] == "ok")]
    expected = sorted(
        d["time_ms"] for d in raw_rows(RING) + raw_rows(SINGLE) if d["kind"] == "max-seq" and d["status"] == "ok"
    )
    assert sorted(ok["time_ms"]) == expected


def test_load_skips_a_bad_line_with_a_warning(tmp_path):
    lines = (SINGLE / "trials.jsonl").read_text().splitlines(keepends=True)
    # the keys every reader needs are there (an incomplete row is refused before): the schema names what is missing
    bad = '{"schema": 1, "kind": "verify", "impl": "naive", "status": "pass"}\n'
    (tmp_path / "trials.jsonl").write_text(lines[0] + bad + "".join(lines[1:]))
    with pytest.warns(UserWarning, match=r"trials.jsonl:2: invalid row skipped \(verify row: missing field 'run'\)"):
        rows = attnbench.load(tmp_path)
    assert len(rows) == len(lines)


def test_a_path_without_results_is_one_error(tmp_path):
    with pytest.raises(AttnbenchError, match="no trials.jsonl under"):
        attnbench.load(tmp_path)
    with pytest.raises(AttnbenchError, match="does not exist"):
        attnbench.load(tmp_path / "missing")
