"""Model presets: the shapes `--model NAME` fills (the models' published configurations),
how they combine with a profile's own table and with explicit options, the `attnbench
models` listing, the command a newcomer types, and the report's model-shapes table read
from hand-made rows."""

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.errors import AttnbenchError
from attnbench.plan import build_plan, models
from attnbench.report.document import Doc, Machine
from attnbench.report.sections.models import render as models_section
from attnbench.results import read_rows

from conftest import typed_row


def test_presets_have_the_published_shapes():
    shapes = {name: (m.heads, m.kv_heads, m.head_dim, m.causal) for name, m in models.PRESETS.items()}
    assert shapes["llama3-8b"] == (32, 8, 128, True)  # num_attention_heads, num_key_value_heads, 4096 / 32
    assert shapes["llama3-70b"] == (64, 8, 128, True)
    assert shapes["llama3.2-1b"] == (32, 8, 64, True)
    assert shapes["gemma-2b"] == (8, 1, 256, True)
    assert shapes["seed"] == (8, 8, 64, False)  # the seed reports' shape, no mask
    assert all(m.heads % m.kv_heads == 0 for m in models.PRESETS.values())


def settings(flags=None, profile=None, impl=("sdpa",)):
    return build_plan("t", list(impl), {"device": "cpu", **(flags or {})}, {}, profile).series[0].settings


def test_a_preset_fills_the_shape_and_explicit_options_override_it():
    s = settings({"model": "llama3-8b"})
    assert (s.heads, s.kv_heads, s.head_dim, s.causal, s.model) == (32, 8, 128, True, "llama3-8b")
    s = settings({"model": "llama3-8b", "heads": 16, "causal": False})
    assert (s.heads, s.kv_heads, s.head_dim, s.causal) == (16, 8, 128, False)
    with pytest.raises(AttnbenchError, match="--heads 12 is not a multiple of --kv-heads 8.*model llama3-8b"):
        settings({"model": "llama3-8b", "heads": 12})
    with pytest.raises(AttnbenchError, match="unknown model 'llama-9'.*llama3-8b"):
        settings({"model": "llama-9"})


def test_a_profile_brings_its_own_models_and_the_command_line_wins(tmp_path):
    profile = tmp_path / "mine.toml"
    profile.write_text(
        'model = "tiny-gqa"\n'
        "[models.tiny-gqa]\nheads = 6\nkv_heads = 2\nhead_dim = 32\ncausal = true\n"
        '[[sweep]]\nimpl = "sdpa"\n'
        '[[sweep]]\nimpl = "sdpa"\nmodel = "seed"\n'
    )
    plan = build_plan("t", [], {"device": "cpu"}, {}, str(profile))
    shapes = [(s.settings.model, s.settings.heads, s.settings.kv_heads, s.settings.causal) for s in plan.series]
    assert shapes == [("tiny-gqa", 6, 2, True), ("seed", 8, 8, False)]
    assert plan.series[0].name == "sdpa(backend=auto) for tiny-gqa"
    flagged = build_plan("t", [], {"device": "cpu", "model": "llama3-70b"}, {}, str(profile))
    assert {(s.settings.model, s.settings.heads) for s in flagged.series} == {("llama3-70b", 64)}
    listing = CliRunner().invoke(app, ["models", "--profile", str(profile)], terminal_width=300)
    assert listing.exit_code == 0 and "tiny-gqa" in listing.output and "llama3-8b" in listing.output


@pytest.mark.parametrize(
    "table, error",
    [
        ("[models.x]\nheads = 8\nhead_dim = 64\ncausal = true\n", "missing 'kv_heads'"),
        ("[models.x]\nheads = 8\nkv_heads = 3\nhead_dim = 64\ncausal = true\n", "not a multiple of kv_heads 3"),
        ("[models.x]\nheads = 8\nkv_heads = 8\nhead_dim = 64\ncausal = 1\nwidth = 2\n", "unknown key 'width'"),
    ],
)
def test_a_bad_model_table_names_its_fault(tmp_path, table, error):
    profile = tmp_path / "bad.toml"
    profile.write_text(table + '[[sweep]]\nimpl = "sdpa"\n')
    with pytest.raises(AttnbenchError, match=error):
        build_plan("t", [], {"device": "cpu"}, {}, str(profile))


def test_attnbench_models_lists_every_preset():
    result = CliRunner().invoke(app, ["models"], terminal_width=300)
    assert result.exit_code == 0
    lines = {line.split()[1]: line for line in result.output.splitlines() if line.startswith("│")}
    for m in models.PRESETS.values():
        assert m.name in lines
        cells = [c.strip() for c in lines[m.name].split("│")[1:-1]]
        assert cells[1:5] == [str(m.heads), str(m.kv_heads), str(m.heads // m.kv_heads), str(m.head_dim)]


@pytest.mark.slow
def test_a_newcomers_model_command_runs_and_a_bad_head_count_is_one_line(tmp_path, in_process):
    out = tmp_path / "llama"
    # the command in this process; each trial in a fresh process of its own
    proc = in_process("max-seq", "--model", "llama3-8b", "--impl", "sdpa", "--max-seq-len", "1K", "--out", out)
    assert proc.returncode == 0, proc.stderr
    rows, _ = read_rows(out)
    trials = [r for r in rows if r["kind"] == "max-seq"]
    assert trials and all((r["heads"], r["kv_heads"], r["head_dim"], r["causal"]) == (32, 8, 128, True) for r in trials)
    assert all(r["model"] == "llama3-8b" and r["kv_layout"] == "shared" for r in trials if r["status"] == "ok")
    bad = in_process("max-seq", "--impl", "sdpa", "--kv-heads", "3", "--heads", "8", "--out", tmp_path / "bad")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().count("\n") == 0 and "--kv-heads must divide --heads" in bad.stderr
    assert not (tmp_path / "bad").exists()


# --- the report's table, from hand-made rows -------------------------------------------------


def _trial(series, seq_len, peak, mode="fwd", **extra):
    heads, kv, dim = 32, 8, 128
    floor = seq_len * (2 * heads + 2 * kv) * dim * 2 * (2 if mode == "fwd_bwd" else 1)
    row = {"kind": "max-seq", "series": series, "label": "sdpa(backend=cudnn) for llama3-8b", "impl": "sdpa"}
    row |= {"config": {"backend": "cudnn"}, "model": "llama3-8b", "heads": heads, "kv_heads": kv, "head_dim": dim}
    row |= {"dtype": "bf16", "device": "cuda", "causal": True, "mode": mode, "batch": 1, "seq_len": seq_len}
    row |= {"status": "ok", "peak_bytes": peak, "floor_bytes": floor, "memory_limit": 4 << 30, "kv_layout": "shared"}
    return row | extra


def _typed(rows):
    """Hand-made rows as the report reads them (schema objects); a result row keeps only its fields."""
    out = []
    for r in rows:
        r = {k: v for k, v in r.items() if v is not None}
        if r["kind"] == "max-seq-result":
            r = {k: v for k, v in r.items() if k not in ("status", "peak_bytes", "floor_bytes", "kv_layout")}
            r = {k: v for k, v in r.items() if k not in ("memory_limit", "tflops_useful", "time_ms")}
        out.append(typed_row(r.pop("kind"), **r))
    return out


def test_the_model_table_shows_bytes_per_token_against_the_floor_and_the_search():
    # peaks of 1 MiB plus 20,480 bytes a token: the slope is the floor's bytes per token
    rows = [_trial("f", n, (1 << 20) + 20480 * n, tflops_useful=600.0, time_ms=2.0) for n in (32768, 65536, 131072)]
    rows.append(_trial("f", 262144, None, status="oom"))
    rows.append({**rows[0], "kind": "max-seq-result", "seq_len": 131072, "first_failure": 262144})
    rows += [_trial("t", n, (2 << 20) + 41984 * n, mode="fwd_bwd") for n in (16384, 32768)]
    rows += [
        {**_trial("e", 32768, None, status="unsupported", message="sdpa backend efficient has no grouped-query kernel")}
        | {"config": {"backend": "efficient"}, "label": "sdpa(backend=efficient) for llama3-8b", "kv_layout": None}
    ]
    doc = Doc()
    models_section(doc, Machine("H100", _typed(rows)))
    text = doc.text()
    cudnn = next(line for line in text.splitlines() if "| sdpa(backend=cudnn) |" in line)
    cells = [c.strip() for c in cudnn.split("|")[1:-1]]
    assert cells[0] == "llama3-8b (32 / 8 / 128, causal)" and cells[2] == "shared"
    assert cells[3] == "600.0 (n=1)"  # forward TFLOP/s at 32K
    assert cells[4] == "20,480 (1.00x)" and cells[5] == "131,072 under 4 GiB"
    assert cells[8] == "41,984 (1.02x)"  # training: 40,960 a token at the floor
    efficient = next(line for line in text.splitlines() if "| sdpa(backend=efficient) |" in line)
    assert "unsupported" in efficient and "no grouped-query kernel" in efficient


def test_the_model_table_names_what_produces_it():
    doc = Doc()
    models_section(doc, Machine("H100", _typed([_trial("f", 1024, 1) | {"model": None}])))
    assert "attnbench run --profile models" in doc.text()
