"""The contract every attention implementation follows.

An implementation is a ``torch.nn.Module`` whose ``forward(q, k, v, is_causal=False)`` takes
``(B, N, H, D)`` queries and ``(B, N, H_kv, D)`` keys and values (``H`` a multiple of ``H_kv``:
grouped-query attention, ``attnbench.impls.gqa``) and returns ``(B, N, H, D)``, and which
declares its key sets (docs/design/semantics.md): for each query head ``h`` and query ``t`` the keys
``M_h(t)`` that one softmax runs over. The declaration is what the float64 reference checks
against and what FLOPs and sparsity are counted from. Every call's shapes are checked before
``forward`` runs, so no implementation computes on shapes it would misread.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator

import torch
from torch import nn

from attnbench.errors import ConfigError
from attnbench.impls import gqa
from attnbench.impls.config import Config


class AttentionImpl(nn.Module):
    """Base class: subclasses implement ``forward`` and ``_key_sets``."""

    #: registry name, set by the registry when built
    name: str = ""
    #: True when the first call compiles kernels (its time is recorded apart, untimed)
    compiles: bool = False
    #: False where causal masking has no meaning for the configuration (Hilbert order)
    supports_causal: bool = True
    #: True where pairs are counted from declared key sets (no closed form): counted outside
    #: the trial, once per configuration and length (``trials.counting``)
    counted_pairs: bool = False
    #: True for an outside module that declares no key sets: dense only by default, so its
    #: FLOPs are unknown unless the reference check confirmed dense
    dense_by_default: bool = False
    #: query head j reads key/value head j // (H / H_kv) ("consecutive": torch's enable_gqa,
    #: FlashAttention) or j % H_kv ("interleaved"); the reference check reads the same
    gqa_mapping: str = "consecutive"

    def __init__(self) -> None:
        super().__init__()
        #: what the last forward really ran (e.g. the SDPA backend), for the result row
        self.last_backend: str | None = None
        #: how the last forward held grouped K/V: gqa.SHARED, or gqa.EXPANDED where the
        #: implementation copied them to every query head; None without grouped heads
        self.last_kv_layout: str | None = None
        self.register_forward_pre_hook(_checked_call, with_kwargs=True)

    # --- shape rules -------------------------------------------------------------------
    @property
    def granularity(self) -> int:
        """Sequence lengths this implementation runs at are multiples of this."""
        return 1

    def granularity_reason(self) -> str:
        """Why lengths are multiples of the granularity, as the error says it after the number."""
        return ""

    def check_shape(self, seq_len: int, num_heads: int) -> None:
        """Raise ConfigError (naming the fix) if this configuration cannot run the shape."""
        self.check_length(seq_len)
        if num_heads <= 0:
            raise ConfigError(f"{self.name}: need at least one head")

    def check_length(self, seq_len: int) -> None:
        """The length rule alone (no shape, no pattern): positive and a multiple of the granularity."""
        if seq_len <= 0:
            raise ConfigError(f"{self.name}: sequence length {seq_len} must be positive")
        if seq_len % self.granularity:
            raise ConfigError(
                f"{self.name}: sequence length {seq_len} must be a multiple of {self.granularity}"
                f"{self.granularity_reason()}; nearest valid lengths: {nearest_multiples(seq_len, self.granularity)}"
            )

    def config(self) -> Config:
        """The constructor arguments, as recorded in result rows."""
        return {}

    def device_problem(self, device: str) -> str:
        """Why this configuration cannot run on ``device`` ('' where it can): a sweep refuses
        it before any work."""
        return ""

    # --- key sets ----------------------------------------------------------------------
    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        """Boolean ``(H, N, N)``: entry ``[h, t, u]`` is True when ``u`` is in ``M_h(t)``."""
        raise NotImplementedError

    def key_mask(self, seq_len: int, num_heads: int, causal: bool = False) -> torch.Tensor:
        """The declared key sets at small N, intersected with ``u <= t`` when causal."""
        self.check_shape(seq_len, num_heads)
        mask = self._key_sets(seq_len, num_heads)
        if causal:
            mask = mask & torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
        return mask

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        """Number of (query, key) pairs in the key sets, summed over heads, in closed form.

        Must equal ``key_mask(...).sum()``; the tests hold it to that. Used at large N
        where the mask cannot be built.
        """
        raise NotImplementedError

    def executed_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        """(query, key) pairs the kernels really multiply; defaults to the useful ones."""
        return self.useful_pairs(seq_len, num_heads, causal)

    def pairs_source(self) -> str | None:
        """Who declared the pair counts, where an outside implementation did (its function's
        name); None for attnbench's own closed forms and counts."""
        return None

    def verify_seq_len(self) -> int:
        """A small sequence length at which this configuration can be checked."""
        return max(self.granularity, 128)

    def scaled_config(self, factor: int) -> Config | None:
        """This configuration with every length in tokens divided by ``factor`` (its reduced
        twin, checked where the float64 reference of the configuration itself cannot fit), or
        None where it has no lengths to scale or they do not divide."""
        return None


def _checked_call(impl: AttentionImpl, args: tuple, kwargs: dict) -> None:
    """Before every forward: the shapes (gqa.check_inputs); grouped K/V count as shared
    unless the forward says it expanded them."""
    given = list(args[:3]) + [kwargs[name] for name in ("q", "k", "v")[len(args) :] if name in kwargs]
    if len(given) == 3:
        groups = gqa.check_inputs(*given)
        impl.last_kv_layout = gqa.SHARED if groups > 1 else None


def dense_pairs(seq_len: int, num_heads: int, causal: bool) -> int:
    """Pairs of full attention: N^2 per head, N(N+1)/2 when causal."""
    per_head = seq_len * (seq_len + 1) // 2 if causal else seq_len * seq_len
    return num_heads * per_head


def lcm(values: list[int] | tuple[int, ...]) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


@contextlib.contextmanager
def quiet_eager_flex() -> Iterator[None]:
    """FlexAttention run without torch.compile (its only path on the CPU) warns on every call:
    noise in a benchmark's output, whether attnbench's flex or an outside module calls it."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


def nearest_multiples(n: int, step: int) -> str:
    """The valid lengths either side of ``n``: '4096 or 8192', or '4096' when none is below."""
    below, above = n // step * step, (n // step + 1) * step
    return f"{below} or {above}" if below > 0 else str(above)
