"""What a user meets before any run: sizes that name their unit, --version, and the defaults
shown in --help (a default written in square brackets must survive rich's markup)."""

import re

import pytest

from attnbench import __version__
from attnbench.errors import AttnbenchError
from attnbench.units import clip_text, parse_bytes

from conftest import typed_row


@pytest.mark.parametrize(
    "text, expected",
    [("2GiB", 2 << 30), ("512MB", 512 * 10**6), ("1.5GiB", 3 << 29), ("4096B", 4096), (" 8 GB", 8 * 10**9)],
)
def test_a_size_with_its_unit_reads_as_written(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(
    "text, why",
    [
        ("80", "has no unit"),  # 80 bytes is never what `--gpu-memory 80` meant
        (1073741824, "has no unit"),  # a TOML integer
        ("0.0001", "has no unit"),
        ("256M", "ambiguous unit 'M'"),  # 256 MB or 256 MiB: the user says which
        ("0.1B", "less than one byte"),
        ("-1GiB", "is negative: a size must be positive"),  # read, and refused for its sign
        ("lots", "cannot read"),
    ],
)
def test_a_size_without_a_unit_or_of_nothing_is_refused_with_the_accepted_forms(text, why):
    with pytest.raises(AttnbenchError) as err:
        parse_bytes(text)
    assert why in str(err.value) and "GiB" in str(err.value) and "MB" in str(err.value)


@pytest.mark.slow
def test_unit_less_sizes_exit_2_on_the_command_line(cli, tmp_path):
    predict = cli("predict", "--impl", "naive", "--gpu-memory", "80", "--from", tmp_path)
    limit = cli("max-seq", "--impl", "naive", "--device", "cpu", "--memory-limit", "256M", "--out", tmp_path / "o")
    for proc in (predict, limit):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "80GB" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_version(cli):
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"attnbench {__version__}"


def test_help_shows_each_default_once_in_one_form(cli):
    text = cli("max-seq", "--help").stdout
    for option, default in [("--dtype", "bf16"), ("--device", "auto"), ("--mode", "fwd"), ("--heads", "8")]:
        line = next(ln for ln in text.splitlines() if re.search(rf"{option}\s", ln))
        assert f"[default: {default}]" in line, line
    assert not re.search(r"\[\d+\]", text)  # no bare "[8]" beside "[default: 8]"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_derived_files_and_rows_take_the_users_umask(tmp_path, umask, mode):
    import os

    from attnbench.results import ResultsWriter, write_text_atomic

    old = os.umask(umask)
    try:
        write_text_atomic(tmp_path / "report.md", "# report\n")
        ResultsWriter(tmp_path).append({"kind": "max-seq-result", "run": "r", "series": "s", "label": "l"} | WORKLOAD)
    finally:
        os.umask(old)
    assert [(tmp_path / f).stat().st_mode & 0o777 for f in ("report.md", "trials.jsonl")] == [mode, mode]


WORKLOAD = {"impl": "naive", "config": {}, "batch": 1, "seq_len": 128, "heads": 1, "head_dim": 8}
WORKLOAD |= {"dtype": "fp32", "device": "cpu", "causal": False}


CUDA_OOM = (
    "OutOfMemoryError: CUDA out of memory. Tried to allocate 19.75 GiB. GPU 0 has a total capacity of 79.18 GiB "
    "of which 19.41 GiB is free. Including non-PyTorch memory, this process has 59.76 GiB memory in use."
)


def test_a_long_message_is_cut_after_a_sentence_or_a_word_never_inside_one():
    cut = clip_text(CUDA_OOM, 160)
    assert cut == (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 19.75 GiB. GPU 0 has a total capacity of 79.18 GiB "
        "of which 19.41 GiB is free. …"
    )
    words = "alpha beta gamma delta epsilon " * 4
    short = clip_text(words, 30)
    assert len(short) <= 30 and short.endswith("…") and short[:-1].split()[-1] in words.split()
    assert clip_text("fits as it is", 30) == "fits as it is"


def test_a_retried_trial_says_it_is_a_retry(capsys):
    from types import SimpleNamespace

    from attnbench.cli.progress import RichReporter

    row = {"phase": "bracket", "seq_len": 4096, "status": "oom", "message": CUDA_OOM}
    ok = {"phase": "grow", "seq_len": 2048, "status": "ok"}
    series = SimpleNamespace(settings=SimpleNamespace(max_trial_seconds=10))
    reporter = RichReporter()
    for r in (ok, row, {**row, "attempt": 2}, {**ok, "phase": "confirm", "attempt": 2}):
        reporter.trial_done(series, typed_row("max-seq", **r), replayed=False)
    grow, first, second, confirm = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert "retry" not in first and "bracket (retry)" in second
    assert "retry" not in confirm  # the confirmation runs a length that succeeded: not a retry
    assert "Including non-PyTorch mem" not in first and first.endswith(". …")  # cut after a sentence


def test_the_sequence_parallel_readout_fits_a_terminal_and_keeps_every_column_in_sweep_md(tmp_path, capsys):
    """Two ring points (1 and 2 ranks): the console shows six columns, unabridged names;
    sweep.md holds the whole table."""
    import json

    from attnbench.cli.sweep import _scaling_readout
    from attnbench.report.run_files import write_run_files

    from conftest import typed_row

    rows = [
        typed_row(
            "points",
            series=f"s{p}",
            label=f"ring(backend=auto) x{p}",
            impl="ring",
            strategy="ring",
            world_size=p,
            device="cpu",
            dtype="fp32",
            time_ms=ms,
            times_ms=[ms] * 5,
        )
        for p, ms in ((1, 4.0), (2, 2.5))
    ]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    write_run_files(tmp_path)
    _scaling_readout(tmp_path)
    out = capsys.readouterr().out
    assert "ring(backend=auto) x2" in out and "1.60x vs ring" in out and "0.80" in out
    assert max(len(line) for line in out.splitlines() if "│" in line) <= 120  # the table's rows
    assert "| Efficiency (same split) |" in (tmp_path / "sweep.md").read_text()


@pytest.mark.parametrize("width", [60, 100, 160, 220])
def test_a_failed_trials_line_fits_the_console_with_at_least_40_characters_of_message(capsys, monkeypatch, width):
    from types import SimpleNamespace

    from attnbench.cli import base
    from attnbench.cli.progress import RichReporter

    monkeypatch.setattr(base.console, "width", width)
    message = "RuntimeError: [enforce fail at alloc_cpu.cpp:127] data. DefaultCPUAllocator: not enough memory: " * 3
    row = typed_row(phase="bracket", seq_len=4096, status="oom", message=message, peak_bytes=3 * 10**9)
    RichReporter().trial_done(SimpleNamespace(settings=SimpleNamespace(max_trial_seconds=10)), row, replayed=False)
    line = capsys.readouterr().out.rstrip("\n")
    assert "\n" not in line and (len(line) <= width or width < 100), line  # 60: the 40-character floor
    assert "RuntimeError: [enforce fail at" in line  # a message of 40 characters keeps its first words


@pytest.mark.parametrize("width", [100, 160, 220])
def test_a_failed_speedup_trials_line_fits_the_console_too(capsys, monkeypatch, width):
    from attnbench.cli import base
    from attnbench.cli.progress import SpeedupReporter

    monkeypatch.setattr(base.console, "width", width)
    message = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total capacity " * 4
    row = typed_row("speedup", case="ring 64K", strategy="ring", status="oom", message=message)
    SpeedupReporter().trial_done(row, replayed=True)
    line = capsys.readouterr().out.rstrip("\n")
    assert "\n" not in line and len(line) <= width, line
    assert "(from earlier run)" in line and "CUDA out of memory." in line


@pytest.mark.parametrize("tflops, shown", [(0.0853, "85.3 GFLOP/s"), (0.004, "4.0 GFLOP/s"), (312.4, "312.4 TFLOP/s")])
def test_a_trials_rate_reads_in_gflops_under_one_tflops(capsys, tflops, shown):
    from types import SimpleNamespace

    from attnbench.cli.progress import RichReporter

    row = typed_row(phase="grow", seq_len=2048, status="ok", tflops_executed=tflops)
    RichReporter().trial_done(SimpleNamespace(settings=SimpleNamespace(max_trial_seconds=10)), row, replayed=False)
    assert shown in capsys.readouterr().out


@pytest.mark.parametrize("command", [[], ["bench"], ["run"], ["speedup"]])
def test_help_shows_no_value_for_a_flag(cli, command):
    text = cli(*command, "--help").stdout
    flags = [ln for ln in text.splitlines() if re.search(r"--(help|resume|version|causal|in-process)\s", ln)]
    assert flags and not any("<bool>" in ln for ln in flags), flags  # a flag takes no value
    assert "<bool>" not in text


def test_list_fits_120_columns_and_keeps_every_parameter(cli):
    from attnbench import impls

    lines = cli("list").stdout.splitlines()
    assert max(len(line) for line in lines) <= 120
    for name in impls.names():  # wrapping dropped nothing: each name and parameter still starts a line
        assert any(line.startswith(f"{name}  ") for line in lines), name
        for p in impls.spec(name).params:
            assert any(line.startswith(f"    --param {p.name}=") for line in lines), (name, p.name)


def test_list_names_every_multi_gpu_strategy_with_what_it_does(capsys):
    """A newcomer choosing ``speedup --strategy`` reads each strategy's name, label and what it
    does at the end of `attnbench list`, as the report labels its rows."""
    from attnbench.cli.verify import show_strategies
    from attnbench.plan.strategies import DECLARED

    show_strategies()
    text = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "multi-GPU strategies" in text and "--strategy` takes dp, mp, thread" in text
    for d in DECLARED:
        assert f"{d.name} {d.label}: {d.summary}" in text, d.name


# --- what a newcomer meets first: help at 80 columns, a typo, a length's forms, two lengths apart ---------------------


@pytest.mark.parametrize(
    "command",
    ["list", "models", "verify", "max-seq", "bench", "run", "report", "predict", "check", "speedup", "pattern"],
)
def test_every_commands_help_reads_whole_at_80_columns(command):
    """No help text cut with '…' in an 80-column terminal, no line wider, and every option named."""
    import typer
    from typer.testing import CliRunner

    from attnbench.cli import app

    text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "80", "TERMINAL_WIDTH": "80"}).stdout
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    options = [o for p in typer.main.get_command(app).commands[command].params for o in p.opts if o.startswith("--")]
    assert [o for o in options if not re.search(rf"{o}\b", text)] == [], text


def test_a_mistyped_implementation_is_refused_with_the_nearest_name():
    from attnbench import impls

    for typo, meant in (("sdpaa", "sdpa"), ("blocksparse", "block-sparse"), ("dilatd", "dilated")):
        with pytest.raises(AttnbenchError, match=rf"unknown implementation '{typo}' \(did you mean {meant}\?\)"):
            impls.spec(typo)
    with pytest.raises(AttnbenchError) as far:  # nothing near: no suggestion, the names to choose from
        impls.spec("zzz")
    assert "did you mean" not in str(far.value) and all(n in str(far.value) for n in impls.names())


@pytest.mark.parametrize("option, value", [("seq_lens", "1X"), ("seq_lens", "1.5K"), ("start", "1X")])
def test_a_length_that_cannot_be_read_names_the_forms_that_can(option, value):
    """The examples the message gives are lengths the same option reads: 4096, 16K (16,384), 1M."""
    from attnbench.plan import COMMAND_LINE, parse_settings

    with pytest.raises(AttnbenchError) as err:
        parse_settings({option: value}, COMMAND_LINE)
    message = str(err.value)
    examples = re.findall(r"\b\d+[KMG]?\b(?=[,\s]|$)", message.split("e.g.")[1])
    assert {"4096", "16K", "1M"} <= set(examples), message
    read = [parse_settings({option: example}, COMMAND_LINE)[option] for example in ("4096", "16K", "1M")]
    assert read == ([(4096,), (16384,), (2**20,)] if option == "seq_lens" else [4096, 16384, 2**20])


@pytest.mark.parametrize(
    "ran, failed, shown",
    [
        (1_966_080, 1_990_656, ("1.88M", "1.90M")),  # 1.875 and 1.898 x 2**20: one decimal reads 1.9M twice
        (3_328, 3_584, ("3.2K", "3.5K")),  # 3.25 and 3.5 x 2**10: one decimal tells them apart
        (2_096_128, 2**21, ("1.999M", "2M")),  # 1.99902 x 2**20: '2.0M' would read as 2M
        (1_990_656, 1_990_657, ("1,990,656", "1,990,657")),  # closer than three decimals: the digits
    ],
)
def test_an_answer_and_its_first_failure_never_read_as_one_length(ran, failed, shown):
    from attnbench.report.intervals import bracket
    from attnbench.units import format_tokens, short_tokens, token_pair

    assert token_pair(ran, failed, short_tokens) == shown
    assert bracket(ran, failed, short_tokens) == f"{shown[0]} – {shown[1]}"
    long_ran, long_failed = token_pair(ran, failed, format_tokens)
    assert long_ran.startswith(f"{ran:,}") and long_failed.startswith(f"{failed:,}")
    assert long_ran.split(" ")[-1] != long_failed.split(" ")[-1]  # a short form in brackets differs too, or is left out


def test_the_terminal_summary_gives_the_answer_and_the_failure_apart(tmp_path, capsys):
    """A search that ran 1,966,080 tokens and failed at 1,990,656: the summary table reads
    1.88M and 1.90M, the progress line as well."""
    import json
    from types import SimpleNamespace

    from attnbench.cli.progress import RichReporter
    from attnbench.cli.sweep import _print_summary

    rows = [
        typed_row("max-seq", seq_len=1_966_080, device="cpu", peak_bytes=2**20),
        typed_row("max-seq", seq_len=1_990_656, device="cpu", status="oom"),
        typed_row("max-seq-result", seq_len=1_966_080, device="cpu", max_seq_len=1_966_080, first_failure=1_990_656),
    ]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    _print_summary(tmp_path)
    RichReporter().series_done(None, SimpleNamespace(best=1_966_080, first_failure=1_990_656, stopped_by="memory"))
    out = capsys.readouterr().out
    assert "1,966,080 (1.88M)" in out and "at 1,990,656 (1.90M)" in out and "(1.9M)" not in out, out


def test_impl_takes_a_list_as_gpus_and_strategy_do(in_process):
    """``--impl a,b`` is ``--impl a --impl b`` (it was one unknown name, "a,b"): one line per implementation."""
    proc = in_process("verify", "--impl", "sdpa, naive", "--impl", "naive", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines() if " pass " in line] == ["sdpa", "naive"]


@pytest.mark.parametrize(
    "args",
    [
        ("bench", "--impl", "sdpa", "--seq-lens", "1K"),
        ("max-seq", "--impl", "naive"),
        ("bench", "--impl", "ring", "--gpus", "2", "--seq-lens", "4K"),
        ("run",),
    ],
)
def test_the_default_device_on_a_gpu_machine_is_cuda_for_every_sweep_command(monkeypatch, in_process, args):
    """Without --device on a machine with two GPUs (faked: the plan is caught before it runs),
    every series runs on cuda and `run` takes the GPU profile: a default path no CPU run takes
    (speedup's counted 0 GPUs under it once)."""
    import torch

    from attnbench.cli import sweep as cli_sweep
    from attnbench.sweeps import runner

    plans = []
    monkeypatch.setattr(runner, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(cli_sweep, "_run_resolved", lambda plan, *rest: plans.append(plan))
    proc = in_process(*args)
    assert proc.returncode == 0, proc.stderr
    (plan,) = plans
    assert plan.series and {s.settings.device for s in plan.series} == {"cuda"}
    if args == ("run",):
        assert plan.name == "default"
