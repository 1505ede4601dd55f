"""Bad input: a one-line error that names the fix, exit code 2, no traceback, and no
results file created or changed.

Each case runs the command through the console entry point in this process (``in_process``:
main() as a console script calls it, its handlers and streams put back after), which costs no
interpreter start and no imports per case; a few run as the real command in a fresh process,
where the process is the point (what it imports before refusing, a user's shell)."""

import re
from pathlib import Path

import pytest

from conftest import run_cli

CPU = ["--device", "cpu", "--dtype", "fp32", "--heads", 2, "--head-dim", 16]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


BAD = {
    "unknown implementation": (["max-seq", "--impl", "flash9000", *CPU], "attnbench list"),
    "an unknown name in a list": (["max-seq", "--impl", "naive,flash9000", *CPU], "'flash9000'"),
    "a list of no names": (["bench", "--impl", " , ", "--seq-lens", "128", *CPU], "--impl names no implementation"),
    "unknown parameter": (["max-seq", "--impl", "naive", "--param", "windw=3", *CPU], "parameter"),
    "segment not dividing N": (
        ["bench", "--impl", "dilated", "--segment-lengths", "256", "--dilation-rates", "1", "--seq-lens", "1000", *CPU],
        "multiple of 256",
    ),
    "zero length": (["bench", "--impl", "sdpa", "--seq-lens", "0", *CPU], "sequence length 0 must be positive"),
    "zero length among others": (["bench", "--impl", "naive", "--seq-lens", "1K,0", *CPU], "must be positive"),
    "dilation not dividing segment": (
        ["max-seq", "--impl", "dilated", "--segment-lengths", "256,512", "--dilation-rates", "3,2", *CPU],
        "does not divide",
    ),
    "mismatched lists": (
        ["max-seq", "--impl", "dilated", "--segment-lengths", "256,512", "--dilation-rates", "1", *CPU],
        "one dilation rate per segment length",
    ),
    "fewer heads than groups": (
        [
            "max-seq",
            "--impl",
            "dilated",
            "--segment-lengths",
            "64,128,256",
            "--dilation-rates",
            "1,2,4",
            "--device",
            "cpu",
            "--heads",
            "2",
        ],
        "at least 3 heads",
    ),
    "backend that cannot run here": (["max-seq", "--impl", "sdpa", "--backend", "cudnn", *CPU], "runs on CUDA only"),
    "unknown dtype": (["max-seq", "--impl", "naive", "--device", "cpu", "--dtype", "fp8"], "dtype"),
    "cuda without a GPU": (["max-seq", "--impl", "naive", "--device", "cuda"], "--device cpu"),
    "speedup on cuda without a GPU": (["speedup", "--impl", "sdpa", "--device", "cuda"], "--device cpu"),
    "verify on cuda without a GPU": (["verify", "--impl", "sdpa", "--device", "cuda"], "--device cpu"),
    "bad memory limit": (["max-seq", "--impl", "naive", *CPU, "--memory-limit", "lots"], "2GiB"),
    "negative memory limit": (["max-seq", "--impl", "naive", *CPU, "--memory-limit", "-1GiB"], "must be positive"),
    "a length in no accepted form": (["bench", "--impl", "naive", "--seq-lens", "1X", *CPU], "16K = 16,384"),
    "zero timing budget": (
        ["bench", "--impl", "naive", "--seq-lens", "128", *CPU, "--timing-budget", "0"],
        "--timing-budget must be a positive number of seconds",
    ),
    "zero repeats": (["bench", "--impl", "naive", "--seq-lens", "128", *CPU, "--repeat", "0"], "--repeat must be"),
    "negative heads": (
        ["max-seq", "--impl", "naive", "--device", "cpu", "--heads", "-3"],
        "--heads must be a positive",
    ),
    "a length beyond any device": (["bench", "--impl", "naive", "--seq-lens", "10" * 10, *CPU], "2^40"),
    "a speedup case beyond the device": (
        ["speedup", "--impl", "naive", "--device", "cpu", "--cases", f"256x{10**18}"],
        "more than the cpu's",
    ),
    "unknown profile": (["run", "--profile", "no-such-profile"], "not found"),
    "unknown option": (["max-seq", "--impl", "naive", "--hedas", "2"], "--hedas"),
    "option of the wrong type": (["max-seq", "--impl", "naive", "--heads", "eight"], "--heads"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(name, tmp_path, in_process):
    args, hint = BAD[name]
    out = tmp_path / "out"
    proc = in_process(*args, "--out", out)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ") and hint in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout
    assert not out.exists()


@pytest.mark.slow
def test_bad_input_in_a_fresh_process_as_a_user_types_it(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("max-seq", "--impl", "flash9000", *CPU, "--out", out)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "attnbench list" in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout and not out.exists()


PROFILES = {
    "unknown top-level key": ('dtyp = "bf16"\n[[sweep]]\nimpl = "naive"\n', "'dtyp'"),
    "unknown sweep key": ('[[sweep]]\nimpl = "dilated"\nsegment_length = [64]\n', "'segment_length'"),
    "wrong type": ('heads = "eight"\n[[sweep]]\nimpl = "naive"\n', "'heads'"),
    "bad parameter type": ('[[sweep]]\nimpl = "dilated"\nsegment_lengths = "many"\n', "segment_lengths"),
    "not toml": ("[[sweep]\nimpl = naive\n", "not valid TOML"),
    "no sweeps": ('device = "cpu"\n', "[[sweep]]"),
    "sweep without impl": ("[[sweep]]\nstart = 1024\n", "'impl'"),
    # values that make no sense, refused before anything runs
    "negative sequence length": ('[[sweep]]\nimpl = "naive"\nkind = "points"\nseq_lens = ["-4K"]\n', "'seq_lens'"),
    "negative memory limit": ('memory_limit = "-1GiB"\n[[sweep]]\nimpl = "naive"\n', "'memory_limit'"),
    "zero heads": ('heads = 0\n[[sweep]]\nimpl = "naive"\n', "'heads' must be a positive integer"),
    "impl that is not a name": ("[[sweep]]\nimpl = 3\n", "'impl' must be an implementation's name"),
    "a label of two lines": ('[[sweep]]\nimpl = "naive"\nlabel = "a\\n# b"\n', "no newline"),
    # 2**62 sequences of q, k, v and the output are more bytes than any device holds
    "batch beyond any device": (
        'batch = 4611686018427387904\n[[sweep]]\nimpl = "naive"\n',
        "batch 4611686018427387904",
    ),
}


@pytest.mark.parametrize("name", list(PROFILES))
def test_malformed_profile_names_the_key(name, tmp_path, in_process):
    text, hint = PROFILES[name]
    profile = write(tmp_path / "p.toml", text)
    out = tmp_path / "out"
    proc = in_process("max-seq", "--profile", profile, "--device", "cpu", "--out", out)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and hint in lines[0], proc.stderr
    assert not out.exists()


def test_bad_input_leaves_existing_results_unchanged(tmp_path, in_process):
    out = tmp_path / "out"
    out.mkdir()
    (out / "trials.jsonl").write_text('{"schema": 1, "kind": "verify"}\n')
    before = (out / "trials.jsonl").read_bytes()
    proc = in_process(
        "max-seq",
        "--impl",
        "dilated",
        "--segment-lengths",
        "256",
        "--dilation-rates",
        "3",
        *CPU,
        "--out",
        out,
        "--resume",
    )
    assert proc.returncode == 2
    assert (out / "trials.jsonl").read_bytes() == before


@pytest.mark.parametrize("command", [["bench", "--seq-lens", "1K"], ["max-seq"]])
def test_a_missing_implementation_names_only_options_the_command_has(command, tmp_path, in_process):
    proc = in_process(*command, *CPU, "--out", tmp_path / "out")
    options = re.findall(r"--[a-z][a-z-]*", proc.stderr)
    help_text = in_process(command[0], "--help").stdout  # the command's own options: the truth
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and "--impl" in options, proc.stderr
    assert all(re.search(rf"{o}(?![\w-])", help_text) for o in options), (options, proc.stderr)


def test_a_length_off_the_segments_names_one_rule_and_lengths_that_follow_it():
    from attnbench import impls
    from attnbench.errors import ConfigError

    dilated = impls.build("dilated", segment_lengths=[256, 512], dilation_rates=[1, 2])
    with pytest.raises(ConfigError) as err:
        dilated.check_shape(1000, 2)
    # one rule: the least common multiple of the segments (512), and the valid lengths either side
    assert "multiple of 512" in str(err.value) and "512 or 1024" in str(err.value), str(err.value)
    for n in (512, 1024):  # the lengths it offers are ones it runs
        dilated.check_shape(n, 2)
    with pytest.raises(ConfigError, match="must be positive"):
        impls.build("sdpa").check_shape(0, 2)


def test_a_pattern_beyond_any_device_is_one_line(in_process):
    proc = in_process("pattern", "--seq-len", 10**18)
    assert proc.returncode == 2 and "2^40" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_profile_that_is_a_directory_is_one_line(tmp_path, in_process):
    proc = in_process("max-seq", "--profile", tmp_path, "--device", "cpu", "--out", tmp_path / "out")
    assert proc.returncode == 2 and "is not a file" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


HUGE = "8" * 10**7  # 10 MB: only a profile carries that much (one argument is at most 128 KiB)


@pytest.mark.slow  # a 10 MB profile read three times
@pytest.mark.parametrize("line", [f'heads = "{HUGE}"', f'model = "{HUGE}"', f'memory_limit = "{HUGE}"'])
def test_an_error_echoes_only_the_start_of_a_huge_value(tmp_path, line, in_process):
    profile = write(tmp_path / "p.toml", f'{line}\n[[sweep]]\nimpl = "naive"\n')
    proc = in_process("max-seq", "--profile", profile, "--device", "cpu", "--out", tmp_path / "out")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and len(proc.stderr) < 1000, proc.stderr[:300]


def test_an_option_too_long_for_its_type_is_echoed_in_part(tmp_path, in_process):
    proc = in_process("max-seq", "--impl", "naive", "--heads", "x" * 100_000, "--out", tmp_path / "out")
    assert proc.returncode == 2 and len(proc.stderr) < 1100 and "--heads" in proc.stderr, proc.stderr[:300]


REFUSED_BEFORE_TORCH = {
    "negative heads": ["max-seq", "--impl", "naive", "--heads", "-3"],
    "zero timing budget": ["bench", "--impl", "naive", "--seq-lens", "128", "--timing-budget", "0"],
    "a length beyond any device": ["bench", "--impl", "naive", "--seq-lens", str(10**18)],
    "a bad speedup case": ["speedup", "--impl", "naive", "--cases", "256x0"],
    "a pattern beyond any device": ["pattern", "--seq-len", str(10**18)],
    "an unknown dtype to verify": ["verify", "--impl", "naive", "--dtype", "fp8"],
    "a mistyped implementation": ["max-seq", "--impl", "sdpaa", "--device", "cpu"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(REFUSED_BEFORE_TORCH))
def test_a_bad_option_is_refused_before_torch_is_imported(name, tmp_path):
    """torch takes seconds to import: an option is checked by type and range first."""
    proc = run_cli(*REFUSED_BEFORE_TORCH[name], env={"PYTHONPROFILEIMPORTTIME": "1"})
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")}
    assert proc.returncode == 2 and imported, proc.stderr[-500:]
    assert "torch" not in imported and "numpy" not in imported
