"""Every registered implementation, built-in or added later, meets the contract of
``AttentionImpl`` at small sizes on the CPU: its declared mask has as many pairs as its
closed-form count says, its output matches the float64 masked reference, a length off its
granularity is refused, and ``attnbench list`` shows it with its parameters."""

import pytest
import torch
from typer.testing import CliRunner

from attnbench import impls
from attnbench.cli import app
from attnbench.errors import ConfigError
from attnbench.trials.reference import TOLERANCE, masked_reference, relative_error

BATCH, HEADS, HEAD_DIM = 2, 3, 16  # 3 heads: head groups that do not divide evenly


def first_config(name: str) -> dict:
    """The first configuration `attnbench verify` checks on the CPU (else the defaults)."""
    configs = impls.spec(name).verify_configs
    configs = configs("cpu") if callable(configs) else configs
    return dict(configs[0]) if configs else {}


def built(name: str):
    return impls.build(name, **first_config(name))


def causal_modes(impl) -> list[bool]:
    return [False, True] if impl.supports_causal else [False]


@pytest.mark.parametrize("name", impls.names())
def test_declared_mask_has_the_closed_form_pair_count(name):
    impl = built(name)
    n = impl.verify_seq_len()
    for causal in causal_modes(impl):
        mask = impl.key_mask(n, HEADS, causal)
        assert mask.shape == (HEADS, n, n) and mask.dtype == torch.bool
        assert int(mask.sum()) == impl.useful_pairs(n, HEADS, causal), f"causal={causal}"
        assert impl.executed_pairs(n, HEADS, causal) >= impl.useful_pairs(n, HEADS, causal)
        if causal:  # the causal rule in original positions: nothing above the diagonal
            assert not mask.triu(diagonal=1).any()


@pytest.mark.parametrize("name", impls.names())
def test_output_matches_the_float64_reference(name):
    if "cpu" not in impls.spec(name).devices:
        pytest.skip(f"{name} runs on {', '.join(impls.spec(name).devices)} only")
    impl = built(name)
    n = impl.verify_seq_len()
    gen = torch.Generator().manual_seed(0)
    # inputs rounded to fp32 first, so the reference sees exactly what the implementation sees
    q, k, v = (torch.randn(BATCH, n, HEADS, HEAD_DIM, generator=gen, dtype=torch.float64).float() for _ in range(3))
    for causal in causal_modes(impl):
        ref = masked_reference(q, k, v, impl.key_mask(n, HEADS, causal))
        # a sequence-parallel implementation outside a process group is a ring of one rank:
        # it takes and returns its tokens in the order its shard layout declares
        order = impl.shard_positions(n, 0, causal) if impls.spec(name).distributed else torch.arange(n)
        with torch.no_grad():
            out = impl(q[:, order], k[:, order], v[:, order], is_causal=causal)
        assert out.shape == q.shape
        assert relative_error(out, ref[:, order]) <= TOLERANCE["fp32"], f"causal={causal}"


@pytest.mark.parametrize("name", impls.names())
def test_a_length_off_the_granularity_is_refused(name):
    impl = built(name)
    n = impl.verify_seq_len()
    assert n % impl.granularity == 0
    impl.check_shape(n, HEADS)  # a multiple runs
    if impl.granularity == 1:
        impl.check_shape(n + 1, HEADS)
    else:
        with pytest.raises(ConfigError, match=f"multiple of {impl.granularity}") as refused:
            impl.check_shape(n + 1, HEADS)
        assert f"nearest valid lengths: {n} or {n + impl.granularity}" in str(refused.value)


@pytest.fixture(scope="module")
def listing() -> dict[str, list[str]]:
    """`attnbench list` as {implementation: its lines}; an entry starts at an unindented line."""
    result = CliRunner().invoke(app, ["list"], terminal_width=400)
    assert result.exit_code == 0, result.output
    entries: dict[str, list[str]] = {}
    for line in result.output.splitlines():
        if line and not line.startswith(" "):
            entries[line.split()[0]] = [line]
        elif entries and line.strip():
            entries[list(entries)[-1]].append(line.strip())
    return entries


@pytest.mark.parametrize("name", impls.names())
def test_attnbench_list_shows_it_with_its_parameters(name, listing):
    spec = impls.spec(name)
    assert name in listing, f"{name} missing from `attnbench list`"
    head, *body = listing[name]
    assert spec.summary in " ".join(listing[name])
    assert any(line.startswith(f"devices: {', '.join(spec.devices)}") for line in body)
    shown = [line.split()[1].split("=")[0] for line in body if line.startswith("--param ")]
    assert shown == [p.name for p in spec.params]


def test_the_declared_sdpa_backends_are_the_ones_the_code_maps():
    """The declarations name SDPA's kernels without torch; the code maps each name to torch's
    backend, and the fused ones are the CUDA kernels."""
    from torch.nn.attention import SDPBackend

    from attnbench.impls import dense
    from attnbench.impls.families import dense as declared

    assert tuple(dense.SDPA_BACKENDS) == declared.SDPA_BACKENDS
    assert dense.SDPA_BACKENDS["math"] is SDPBackend.MATH
    assert declared.CUDA_KERNELS == tuple(n for n in declared.SDPA_BACKENDS if n != "math")
