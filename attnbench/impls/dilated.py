"""LongNet dilated attention (arXiv 2307.02486), head-group layout, as docs/design/semantics.md defines it.

Heads are split into G contiguous groups; group i uses segment length w_i and dilation r_i
with offset o_i = i mod r_i. A query at position p of its segment attends only if
p mod r_i == o_i, and then to the keys of its segment with the same residue. Each
(segment, group) is therefore a dense attention over w_i / r_i tokens. Without autograd on
CUDA (fp16, bf16) a Triton kernel (attnbench.impls.flash) reads those tokens with the
dilation stride and writes each group's output rows, and the zero rows between them, in
place. Otherwise (and with ``kernel=sdpa``) the implementation takes strided views of those
tokens (no copy), folds segments into the batch and lets the fused SDPA kernel do the work, a
chunk of segments at a time so temporaries stay small, copying each chunk's output into its
strided place.

With ``hilbert=True`` the tokens are a 2-D grid (row-major) reordered along a Hilbert curve
(attnbench.masks.hilbert) before the pattern, and the output is returned in the original order:
``M_h(t) = pi^-1(M_pattern(pi(t)))``. Causal masking has no meaning in curve order over a
grid, so the Hilbert ordering runs non-causal only.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.nn.attention import sdpa_kernel

from attnbench.errors import ConfigError
from attnbench.impls import flash, fused_sdpa, gqa
from attnbench.impls.base import AttentionImpl, lcm
from attnbench.impls.config import Config
from attnbench.impls.dense import SDPA_BACKENDS, backend_device_problem, sdpa_backend_in_use
from attnbench.impls.families.dilated import KERNELS
from attnbench.impls.pieces import training_chunk_tokens
from attnbench.masks import hilbert as hilbert_curve
from attnbench.units import brief

# Under autograd, chunks of at most a 16th of the sequence but no fewer tokens than this, so
# short sequences do not pay for many small kernel launches
TRAINING_LEAST_TOKENS = 1 << 16


@dataclass(frozen=True)
class HeadGroup:
    heads: slice
    segment_length: int
    dilation_rate: int
    offset: int
    #: the key/value heads its query heads read (the same heads without grouped K/V)
    kv_heads: slice | None = None

    @property
    def kept_per_segment(self) -> int:
        return self.segment_length // self.dilation_rate

    def heads_of(self, kv: bool) -> slice:
        return self.kv_heads if kv and self.kv_heads is not None else self.heads


def head_groups(num_heads: int, segment_lengths, dilation_rates, kv_heads: int | None = None) -> list[HeadGroup]:
    """Group i has floor(H/G) + (1 if i < H mod G) heads, contiguous, in order. With
    ``kv_heads`` key/value heads (a divisor of H), a group is returned in runs: each run's
    query heads read one key/value head, or whole groups of them, so each run is one call
    over contiguous K/V heads in equal shares; runs of one group share its pattern."""
    g = len(segment_lengths)
    per_kv = num_heads // (kv_heads or num_heads)
    groups, start = [], 0
    for i, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
        size = num_heads // g + (1 if i < num_heads % g else 0)
        for a, b in _kv_runs(start, start + size, per_kv):
            groups.append(HeadGroup(slice(a, b), w, r, i % r, slice(a // per_kv, (b - 1) // per_kv + 1)))
        start += size
    return groups


def _kv_runs(start: int, stop: int, per_kv: int) -> list[tuple[int, int]]:
    """Query heads [start, stop) cut at the borders of key/value groups of ``per_kv`` heads
    where a border falls inside a group: a partial group at each end, whole groups between."""
    first_border = -(-start // per_kv) * per_kv
    last_border = stop // per_kv * per_kv
    if first_border >= last_border:  # no whole group inside: one or two partial runs
        cuts = [start, *([first_border] if start < first_border < stop else []), stop]
    else:
        cuts = [start, first_border, last_border, stop]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if a < b]


# a reduced twin keeps at least this many tokens per dilated segment: a kernel's smallest tile
MIN_TWIN_KEPT = 16


def scale_segments(config: Config, factor: int) -> Config | None:
    """``config`` with its segment lengths (and chunk size) divided by ``factor``, the dilation
    rates kept: None where a segment would not divide or keep ``MIN_TWIN_KEPT`` tokens."""
    lengths, rates = config["segment_lengths"], config["dilation_rates"]
    if any(w % factor or (w // factor) % r or w // factor // r < MIN_TWIN_KEPT for w, r in zip(lengths, rates)):
        return None
    chunk = max(1, config["max_chunk_tokens"] // factor)
    return {**config, "segment_lengths": [w // factor for w in lengths], "max_chunk_tokens": chunk}


def hilbert_twin(grid_width: int, factor: int) -> bool:
    """Whether a Hilbert ordering keeps its shape at 1/``factor`` of the length: the automatic
    grid (N = m 4^k: 2^k rows of m 2^k columns) does when ``factor`` is a power of 4 (k - 1
    and the same m); a given grid width does not."""
    return grid_width == 0 and factor & (factor - 1) == 0 and factor.bit_length() % 2 == 1


def validate_pattern(segment_lengths, dilation_rates) -> None:
    if not segment_lengths:
        raise ConfigError("dilated: give at least one segment length, e.g. --segment-lengths 2048,4096")
    if len(segment_lengths) != len(dilation_rates):
        raise ConfigError(
            f"dilated: {len(segment_lengths)} segment lengths but {len(dilation_rates)} dilation rates; "
            "give one dilation rate per segment length"
        )
    for w, r in zip(segment_lengths, dilation_rates):
        if w <= 0 or r <= 0:
            raise ConfigError("dilated: segment lengths and dilation rates must be positive")
        if w % r:
            raise ConfigError(f"dilated: dilation rate {r} does not divide segment length {w}; choose a divisor of {w}")


class DilatedAttention(AttentionImpl):
    def __init__(
        self,
        segment_lengths=(2048, 4096),
        dilation_rates=(1, 2),
        max_chunk_tokens: int = 1 << 19,
        hilbert: bool = False,
        grid_width: int = 0,
        backend: str = "auto",
        kernel: str = "auto",
    ):
        super().__init__()
        if kernel not in KERNELS:
            raise ConfigError(f"dilated: kernel {brief(kernel)} unknown: choose {' or '.join(KERNELS)}")
        validate_pattern(segment_lengths, dilation_rates)
        if backend not in ("auto", *SDPA_BACKENDS):
            raise ConfigError(
                f"dilated: SDPA backend {brief(backend)} unknown: choose auto, {', '.join(SDPA_BACKENDS)}"
            )
        if max_chunk_tokens <= 0:
            raise ConfigError("dilated: max_chunk_tokens must be positive")
        if grid_width < 0:
            raise ConfigError(f"dilated: grid_width must be 0 (automatic) or positive, got {grid_width}")
        self.segment_lengths = list(segment_lengths)
        self.dilation_rates = list(dilation_rates)
        self.max_chunk_tokens = max_chunk_tokens
        self.hilbert = hilbert
        self.grid_width = grid_width
        self.backend = backend
        self.kernel = kernel

    def config(self):
        config = {
            "segment_lengths": self.segment_lengths,
            "dilation_rates": self.dilation_rates,
            "max_chunk_tokens": self.max_chunk_tokens,
        }
        if self.hilbert:  # default-off options stay out of rows that do not use them
            config.update(hilbert=True, grid_width=self.grid_width)
        if self.backend != "auto":
            config["backend"] = self.backend
        if self.kernel != "auto":
            config["kernel"] = self.kernel
        return config

    def scaled_config(self, factor: int) -> Config | None:
        if self.hilbert and not hilbert_twin(self.grid_width, factor):
            return None
        return scale_segments(self.config(), factor)

    def device_problem(self, device: str) -> str:
        return backend_device_problem("dilated", self.backend, device)

    @property
    def supports_causal(self) -> bool:
        return not self.hilbert

    @property
    def granularity(self) -> int:
        return lcm(self.segment_lengths)

    def verify_seq_len(self) -> int:
        return self.granularity

    def granularity_reason(self) -> str:
        return f", the least common multiple of the segment lengths {', '.join(map(str, self.segment_lengths))}"

    def check_shape(self, seq_len: int, num_heads: int) -> None:
        self.check_length(seq_len)  # the length first: its rule names the segments
        if num_heads < len(self.segment_lengths):
            raise ConfigError(
                f"dilated: {num_heads} heads cannot form {len(self.segment_lengths)} head groups; "
                f"use at least {len(self.segment_lengths)} heads or fewer segment lengths"
            )
        if self.hilbert:
            hilbert_curve.grid_shape(seq_len, self.grid_width)
        super().check_shape(seq_len, num_heads)

    def check_causal(self, causal: bool) -> None:
        if causal and self.hilbert:
            raise ConfigError(
                "dilated with hilbert ordering runs non-causal only (a 2-D grid has no causal order); "
                "drop --causal or the hilbert option"
            )

    def groups(self, num_heads: int) -> list[HeadGroup]:
        return head_groups(num_heads, self.segment_lengths, self.dilation_rates)

    def forward(self, q, k, v, is_causal: bool = False):
        batch, seq_len, num_heads, _ = q.shape
        self.check_shape(seq_len, num_heads)
        self.check_causal(is_causal)
        if self.hilbert:
            order = hilbert_curve.curve_order(seq_len, self.grid_width, q.device)
            q, k, v = (x.index_select(1, order) for x in (q, k, v))
        groups = head_groups(num_heads, self.segment_lengths, self.dilation_rates, k.shape[2])
        kernels = sdpa_kernel([SDPA_BACKENDS[self.backend]]) if self.backend != "auto" else contextlib.nullcontext()
        if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
            kernel = fused_sdpa.pick_kernel(*_one_segment(q, k, groups[0]), is_causal, self.backend)
            self.last_kv_layout = gqa.layout(q, k, expanded=not fused_sdpa.shares_kv(kernel))
            out = DilatedTraining.apply(
                q,
                k,
                v,
                groups,
                is_causal,
                training_chunk_tokens(seq_len, self.max_chunk_tokens, TRAINING_LEAST_TOKENS),
                kernel,
            )
            self.last_backend = "sdpa:" + kernel
        elif self._flash_applies(q, k, v):
            out = torch.empty_like(q)  # the kernel writes every row, the zero rows outside the dilation too
            for g in groups:
                flash.dilated_group(q, k, v, out, g.heads, g.segment_length, g.dilation_rate, g.offset, is_causal)
            self.last_backend = "triton"
        else:
            # the memory-efficient backend has no grouped kernel: it gets each chunk's K/V copied
            expand = self.backend == "efficient" and gqa.heads_differ(q, k, 2)
            self.last_kv_layout = gqa.layout(q, k, expanded=expand)
            with kernels:
                out = torch.zeros_like(q)  # queries outside the dilation keep an empty key set: zero rows
                for g in groups:
                    attend_group(q, k, v, out, g, is_causal, self.max_chunk_tokens, expand)
                self.last_backend = "sdpa:" + (
                    self.backend if self.backend != "auto" else _picked(q, k, groups[0], is_causal)
                )
        if self.hilbert:
            out = torch.empty_like(out).index_copy_(1, order, out)  # back to the original order
        return out

    def _flash_applies(self, q, k, v) -> bool:
        """The Triton forward (reads the dilation in place, writes the output in place) on CUDA
        where it takes the inputs; SDPA where a backend is named, off CUDA and elsewhere."""
        return self.kernel == "auto" and self.backend == "auto" and q.is_cuda and flash.applies(q, k, v)

    def _key_sets(self, seq_len: int, num_heads: int) -> torch.Tensor:
        pos = torch.arange(seq_len)
        mask = torch.zeros(num_heads, seq_len, seq_len, dtype=torch.bool)
        for g in self.groups(num_heads):
            w, r = g.segment_length, g.dilation_rate
            same_segment = (pos[:, None] // w) == (pos[None, :] // w)
            kept = (pos % w) % r == g.offset
            mask[g.heads] = same_segment & kept[:, None] & kept[None, :]
        if self.hilbert:
            # the pattern holds between curve positions: [t, u] = pattern[pi(t), pi(u)]
            pi = hilbert_curve.inverse(hilbert_curve.curve_order(seq_len, self.grid_width))
            mask = mask[:, pi][:, :, pi]
        return mask

    def key_mask(self, seq_len: int, num_heads: int, causal: bool = False) -> torch.Tensor:
        self.check_causal(causal)
        return super().key_mask(seq_len, num_heads, causal)

    def useful_pairs(self, seq_len: int, num_heads: int, causal: bool) -> int:
        total = 0
        for g in self.groups(num_heads):
            kept = g.kept_per_segment
            per_segment = kept * (kept + 1) // 2 if causal else kept * kept
            heads = g.heads.stop - g.heads.start
            total += heads * (seq_len // g.segment_length) * per_segment
        return total


def kept_tokens(x: torch.Tensor, g: HeadGroup, kv: bool = False) -> torch.Tensor:
    """``(B, N, H, D) -> (B, N / w, w / r, Hg, D)``: each segment's kept positions (offset
    o, every r-th) of group ``g``'s heads (its key/value heads for ``kv``), a strided view
    (no copy). N must be a multiple of w."""
    return x[:, :, g.heads_of(kv)].unflatten(1, (-1, g.segment_length))[:, :, g.offset :: g.dilation_rate]


# which of (q, k, v, out) hold key/value heads
QKVO = (False, True, True, False)


def chunk_views(tensors, g: HeadGroup, per_chunk: int, kv: tuple[bool, ...] = ()):
    """Per batch element and chunk of ``per_chunk`` segments, group ``g``'s kept tokens of each
    ``(B, N, H, D)`` tensor (``kv`` marks those with key/value heads; none by default) as a
    ``(segments, Hg, w/r, D)`` view (no copy): the batch of one fused SDPA call. Needs a
    length that is a multiple of the segment length."""
    kv = kv or (False,) * len(tensors)
    views = [kept_tokens(x, g, is_kv) for x, is_kv in zip(tensors, kv)]
    for b in range(views[0].shape[0]):
        for s0 in range(0, views[0].shape[1], per_chunk):
            yield [x[b, s0 : s0 + per_chunk].transpose(1, 2) for x in views]


def attend_group(q, k, v, out, g: HeadGroup, is_causal: bool, max_chunk_tokens: int, expand: bool = False) -> None:
    """Write group ``g``'s heads of ``out``: each segment is a dense attention over its kept
    tokens, folded into the batch of one SDPA call per chunk of segments; ``expand`` copies a
    chunk's grouped K/V to every query head (for a backend without a grouped kernel)."""
    for qc, kc, vc, oc in chunk_views((q, k, v, out), g, max(1, max_chunk_tokens // g.segment_length), QKVO):
        if expand:
            kc, vc = (gqa.expand_kv(x, qc.shape[1] // kc.shape[1], 1) for x in (kc, vc))
        oc.copy_(gqa.sdpa(qc, kc, vc, is_causal=is_causal))


class DilatedTraining(torch.autograd.Function):
    """Forward and backward at the training floor. The forward writes each chunk's output into
    one preallocated output and keeps only each call's log-sum-exp (and the kernel's rng
    state); the backward adds each chunk's dq, dk, dv into preallocated gradients. Autograd
    through strided slices and a concatenation would instead hold every chunk's output apart
    from the concatenated one and build a full-size gradient per slice (1.31x the floor)."""

    @staticmethod
    def forward(ctx, q, k, v, groups, is_causal, chunk_tokens, kernel):
        out = torch.zeros_like(q)  # queries outside the dilation keep an empty key set: zero rows
        ctx.calls = []
        for g in groups:
            for qc, kc, vc, oc in chunk_views((q, k, v, out), g, max(1, chunk_tokens // g.segment_length), QKVO):
                chunk_out, saved = fused_sdpa.forward(qc, kc, vc, is_causal, kernel)
                oc.copy_(chunk_out)
                ctx.calls.append(saved)
        ctx.groups, ctx.chunk_tokens = groups, chunk_tokens
        ctx.save_for_backward(q, k, v, out)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        grad_out = grad_out.contiguous()  # e.g. an expanded gradient of a sum: the kernels want a dense last axis
        grads = [torch.zeros_like(x) for x in (q, k, v)]  # tokens outside the dilation get none
        calls = iter(ctx.calls)
        for g in ctx.groups:
            per_chunk = max(1, ctx.chunk_tokens // g.segment_length)
            views = chunk_views((q, k, v, out, grad_out, *grads), g, per_chunk, (*QKVO, False, *QKVO[:3]))
            for qc, kc, vc, oc, gc, *dx in views:
                for target, got in zip(dx, fused_sdpa.backward(gc, qc, kc, vc, oc, next(calls))):
                    target.add_(got)  # a key/value head read by several runs sums their gradients
        ctx.calls = None  # the log-sum-exps go as soon as they are used
        return (*grads, None, None, None, None)


def _one_segment(q, k, g: HeadGroup):
    """(q, k, v) views of one folded segment of group ``g``: what its kernel calls take."""
    qs = kept_tokens(q[:1, : g.segment_length], g)[0].transpose(1, 2)
    ks = kept_tokens(k[:1, : g.segment_length], g, kv=True)[0].transpose(1, 2)
    return qs, ks, ks


def _picked(q, k, g: HeadGroup, is_causal: bool) -> str:
    """The SDPA backend the dispatcher picks for one folded segment of group ``g``."""
    return sdpa_backend_in_use(*_one_segment(q, k, g), is_causal)


def build_dilated(
    segment_lengths=(2048, 4096),
    dilation_rates=(1, 2),
    max_chunk_tokens=1 << 19,
    hilbert=False,
    grid_width=0,
    backend="auto",
    kernel="auto",
):
    return DilatedAttention(segment_lengths, dilation_rates, max_chunk_tokens, hilbert, grid_width, backend, kernel)
