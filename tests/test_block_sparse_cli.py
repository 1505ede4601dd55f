"""block-sparse from the command line: the pattern command, bad input, and report 002's
sparsity table computed from the rows of a real CPU run."""

import re

import pytest

from attnbench import impls
from attnbench.report.tables.sparsity import sparsity_table
from attnbench.results import load_rows, read_rows

from conftest import run_cli

CPU = ["--device", "cpu", "--dtype", "fp32", "--heads", "2", "--head-dim", "16"]


@pytest.mark.slow
def test_pattern_command_prints_the_kept_fraction_and_draws(tmp_path):
    png = tmp_path / "h.png"
    proc = run_cli(
        "pattern",
        "--pattern-type",
        "hierarchical",
        "--seq-len",
        "16384",
        "--block-size",
        "128",
        "--sparsity-ratio",
        "0.05",
        "--png",
        png,
    )
    assert proc.returncode == 0, proc.stderr
    kept = float(re.search(r"kept fraction ([0-9.]+)", proc.stdout).group(1))
    # independent truth: the declared key sets of the same configuration, counted at token level
    impl = impls.build("block-sparse", pattern_type="hierarchical", block_size=128, sparsity_ratio=0.05)
    assert kept == pytest.approx(float(impl.key_mask(16384, 1).float().mean()), abs=1e-4)
    assert abs(kept - 0.05) <= 0.01
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


BAD = {  # one case per kind of mistake the issue names; the rest are checked in-process below
    "block size not dividing N": (
        ["bench", "--impl", "block-sparse", "--seq-lens", "1000", *CPU],
        "128, the block size; nearest valid lengths: 896 or 1024",
    ),
    # on 1 and 2 ranks: the 2-rank rule is the one named, so the lengths it offers run on both
    "ranks not dividing N": (
        ["bench", "--impl", "block-sparse-ring", "--gpus", "2", "--seq-lens", "1000", *CPU],
        "multiple of 256, whole 128-token blocks on each of 2 ranks; nearest valid lengths: 768 or 1024",
    ),
    "ratio above one": (["max-seq", "--impl", "block-sparse", "--param", "sparsity_ratio=1.5", *CPU], "(0, 1]"),
    "unknown pattern type": (
        ["max-seq", "--impl", "block-sparse", "--param", "pattern_type=banded", *CPU],
        "local_window",
    ),
    "segment not fitting the sequence": (
        [
            "bench",
            "--impl",
            "block-sparse",
            "--param",
            "pattern_type=dilated_sparse",
            "--segment-lengths",
            "2048",
            "--seq-lens",
            "3072",
            *CPU,
        ],
        "multiple of 2048",
    ),
    "ratio a pattern cannot keep": (
        [
            "bench",
            "--impl",
            "block-sparse",
            "--param",
            "pattern_type=hierarchical",
            "--segment-lengths",
            "4096,8192",
            "--seq-lens",
            "8192",
            *CPU,
        ],
        "not within 20%",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(name, tmp_path):
    args, hint = BAD[name]
    out = tmp_path / "out"
    proc = run_cli(*args, "--out", out)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and hint in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out.exists()


@pytest.mark.parametrize(
    "config,seq_len,hint",
    [
        ({"block_size": 100}, 1600, "block_size 100"),
        ({"sparsity_ratio": 0.0}, 1024, "(0, 1]"),
        ({"pattern_type": "hierarchical", "segment_lengths": [1024, 1536]}, 3072, "divide the next"),
        ({"pattern_type": "hierarchical", "dilation_rates": [2, 4]}, 4096, "first dilation rate must be 1"),
        ({"pattern_type": "dilated_sparse", "segment_lengths": [96]}, 4096, "multiple of block_size"),
        ({"segment_lengths": [1024]}, 4096, "takes no segment_lengths"),
        ({"kernel_options": "BLOCK_M"}, 4096, "KEY=VALUE"),
    ],
)
def test_more_bad_configurations_raise_config_errors(config, seq_len, hint):
    from attnbench.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        impls.build("block-sparse", **config).check_shape(seq_len, 2)
    assert hint in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,hint",
    [
        (["--sparsity-ratio", "0"], "(0, 1]"),
        (["--pattern-type", "dilated_sparse", "--segment-lengths", "4096"], "multiple of 4096"),
    ],
)
def test_pattern_command_bad_input_draws_nothing(args, hint, tmp_path):
    png = tmp_path / "p.png"
    full = ["pattern", "--seq-len", "2048", "--block-size", "128", *args, "--png", png]
    proc = run_cli(*full)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and hint in lines[0], proc.stderr
    assert not png.exists()


@pytest.mark.slow
def test_sparsity_table_from_a_real_run(tmp_path):
    out = tmp_path / "run"
    proc = run_cli(
        "bench",
        "--impl",
        "sdpa",
        "--impl",
        "block-sparse",
        "--seq-lens",
        "2048,4096",
        "--param",
        "sparsity_ratio=0.1",
        "--param",
        "block_size=64",
        "--in-process",
        *CPU,
        "--out",
        out,
    )
    assert proc.returncode == 0, proc.stderr
    rows, _ = read_rows(out)
    trials = [r for r in rows if r.get("kind") == "points"]
    assert len(trials) == 4 and all(r["status"] == "ok" for r in trials)
    typed, _ = load_rows(out)
    md = sparsity_table(typed)
    lines = [line for line in md.splitlines() if line.startswith("| ") and "Sequence Length" not in line]
    assert len(lines) == 4
    impl = impls.build("block-sparse", sparsity_ratio=0.1, block_size=64)
    for r in (r for r in trials if r["impl"] == "block-sparse"):
        dense = next(d for d in trials if d["impl"] == "sdpa" and d["seq_len"] == r["seq_len"])
        # the block-sparse row at this length (a time alone may equal the dense row's)
        line = next(line for line in lines if line.startswith(f"| {r['seq_len']:,} ") and "dense sdpa" not in line)
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert cells[1] == f"{r['time_ms']:,.2f}"
        assert cells[4] == "90.0% sparse" and cells[5] == "local_window" and cells[6] == "64"
        assert cells[8] == f"{dense['time_ms'] / r['time_ms']:.2f}x"
        kept = float(impl.key_mask(r["seq_len"], 1).float().mean())  # independent of the runner's count
        assert cells[7] == f"{kept:.2%}"
    dense_cells = [line for line in lines if "dense sdpa" in line]
    assert len(dense_cells) == 2 and all("| Dense |" in line for line in dense_cells)
    assert "Block-sparse against dense" in (out / "sweep.md").read_text()
    assert sparsity_table([r for r in typed if getattr(r, "impl", None) != "block-sparse"]) == ""
