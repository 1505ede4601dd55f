"""A mask_mod evaluated on whole tiles of (query, key) pairs at once: bounds, not values.

``count_blocks`` classifies tiles as FlexAttention's block mask does (every pair kept: full,
none: empty, else partial), but without evaluating every pair: the mask_mod is called with
``Ints``, each the range ``[lo, hi]`` of a tile's query or key positions, and every operation
on them gives bounds that hold for every pair in the tile (interval arithmetic); a comparison
gives ``Bools``, what holds for every pair (``must``) and for some (``may``). A full tile
counts its area, an empty one nothing; a partial one is cut in four and classified again,
down to ``LEAF`` x ``LEAF`` tiles whose pairs are evaluated one by one. The count is exact:
bounds only decide where they hold for every pair. A sliding window at 10M tokens leaves a
few tiles per query block along its two edges: seconds on a CPU, where the N^2 evaluations
of the pairs one by one would take days.

An operation bounds cannot follow (a call outside the arithmetic below, Python's ``if`` on
a tile) raises ``Unbounded``, naming it; the caller then counts pair by pair or says why not.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

MaskMod = Callable[..., Any]

# Tiles this small are evaluated pair by pair (a power of two).
LEAF = 8
# Tiles classified at once, and pairs evaluated at once (bounded temporaries, a few hundred MB).
TILES_PER_STEP = 1 << 18
PAIRS_PER_STEP = 1 << 22


class Unbounded(Exception):
    """The mask_mod did something bounds cannot follow (the message names it)."""


class CountRefused(Exception):
    """The pairs cannot be counted here (the message says why, in one line): a count too long
    to start, or one past its time limit (``time_limit``)."""


_deadline: list[float] = []  # when the count in progress must stop (time.monotonic), innermost last


@contextlib.contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Counts inside stop with CountRefused once ``seconds`` have passed (None: no limit)."""
    _deadline.append(math.inf if seconds is None else time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.pop()


def check_time() -> None:
    """Called between steps of a count: CountRefused once its time limit has passed."""
    if _deadline and time.monotonic() > _deadline[-1]:
        raise CountRefused("counting the pairs did not finish within its time limit")


def _tensor(x: Any) -> torch.Tensor:
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def _ints(x: Any) -> Ints:
    if isinstance(x, Ints):
        return x
    if isinstance(x, Bools):
        raise Unbounded("arithmetic on a comparison's result")
    t = _tensor(x)
    if t.is_floating_point() or t.is_complex():
        raise Unbounded(f"a {t.dtype} operand")
    return Ints(t.long(), t.long())


def _bools(x: Any) -> Bools:
    if isinstance(x, Bools):
        return x
    if isinstance(x, Ints):
        raise Unbounded("an integer used as a boolean")
    t = _tensor(x).to(torch.bool)
    return Bools(t, t)


class Ints:
    """Integers known to lie in ``[lo, hi]`` (elementwise over tiles)."""

    __slots__ = ("lo", "hi", "seen")

    def __init__(self, lo: torch.Tensor, hi: torch.Tensor) -> None:
        self.lo, self.hi = lo, hi
        self.seen = False  # set when an operation read it (the head: key sets that depend on it)

    def _read(self) -> Ints:
        self.seen = True
        return self

    # --- arithmetic --------------------------------------------------------------------
    def __add__(self, other: Any) -> Ints:
        a, b = self._read(), _ints(other)._read()
        return Ints(a.lo + b.lo, a.hi + b.hi)

    __radd__ = __add__

    def __sub__(self, other: Any) -> Ints:
        a, b = self._read(), _ints(other)._read()
        return Ints(a.lo - b.hi, a.hi - b.lo)

    def __rsub__(self, other: Any) -> Ints:
        return _ints(other) - self

    def __neg__(self) -> Ints:
        self._read()
        return Ints(-self.hi, -self.lo)

    def __mul__(self, other: Any) -> Ints:
        a, b = self._read(), _ints(other)._read()
        products = torch.stack(torch.broadcast_tensors(a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi))
        return Ints(products.amin(0), products.amax(0))

    __rmul__ = __mul__

    def __floordiv__(self, other: Any) -> Ints:
        d = _constant(other, "floor division by a tile-dependent divisor")
        self._read()
        if d == 0:
            raise Unbounded("floor division by zero")
        ends = (self.lo // d, self.hi // d)  # floor division is monotone in the dividend
        return Ints(torch.minimum(*ends), torch.maximum(*ends))

    def __mod__(self, other: Any) -> Ints:
        d = _constant(other, "remainder by a tile-dependent divisor")
        self._read()
        if d <= 0:
            raise Unbounded("remainder by a non-positive divisor")
        same = self.lo // d == self.hi // d  # no wrap inside the range: monotone there
        return Ints(torch.where(same, self.lo % d, 0), torch.where(same, self.hi % d, d - 1))

    def abs(self) -> Ints:
        self._read()
        lo = torch.where(self.lo >= 0, self.lo, torch.where(self.hi <= 0, -self.hi, 0))
        return Ints(lo, torch.maximum(self.lo.abs(), self.hi.abs()))

    __abs__ = abs

    def clamp(self, min: Any = None, max: Any = None) -> Ints:  # noqa: A002 (torch's names)
        out = self._read()
        if min is not None:
            out = _minmax(out, min, torch.maximum)
        if max is not None:
            out = _minmax(out, max, torch.minimum)
        return out

    def clamp_min(self, min: Any) -> Ints:  # noqa: A002
        return self.clamp(min=min)

    def clamp_max(self, max: Any) -> Ints:  # noqa: A002
        return self.clamp(max=max)

    # --- comparisons: what holds for every pair, and for some --------------------------
    def __lt__(self, other: Any) -> Bools:
        a, b = self._read(), _ints(other)._read()
        return Bools(a.hi < b.lo, a.lo < b.hi)

    def __le__(self, other: Any) -> Bools:
        a, b = self._read(), _ints(other)._read()
        return Bools(a.hi <= b.lo, a.lo <= b.hi)

    def __gt__(self, other: Any) -> Bools:
        return _ints(other) < self

    def __ge__(self, other: Any) -> Bools:
        return _ints(other) <= self

    def __eq__(self, other: Any) -> Bools:  # type: ignore[override]
        a, b = self._read(), _ints(other)._read()
        single = (a.lo == a.hi) & (b.lo == b.hi)
        return Bools(single & (a.lo == b.lo), (a.lo <= b.hi) & (b.lo <= a.hi))

    def __ne__(self, other: Any) -> Bools:  # type: ignore[override]
        return ~(self == other)

    __hash__ = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        raise Unbounded("Python's if/and/or on a position (use &, |, torch.where)")

    def __getattr__(self, name: str) -> Any:
        raise Unbounded(f"the tensor method .{name}() on a position")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _constant(x: Any, what: str) -> int:
    if isinstance(x, Ints):
        if x.lo.numel() == 1 and x.hi.numel() == 1 and int(x.lo) == int(x.hi):
            return int(x.lo)
        raise Unbounded(what)
    t = _tensor(x)
    if t.numel() != 1 or t.is_floating_point():
        raise Unbounded(what)
    return int(t)


def _minmax(a: Any, b: Any, pick) -> Ints:
    a, b = _ints(a)._read(), _ints(b)._read()
    return Ints(pick(a.lo, b.lo), pick(a.hi, b.hi))  # min and max are monotone in each operand


class Bools:
    """Booleans over tiles: ``must`` where true for every pair, ``may`` where true for some."""

    __slots__ = ("must", "may")

    def __init__(self, must: torch.Tensor, may: torch.Tensor) -> None:
        self.must, self.may = must, may

    def __and__(self, other: Any) -> Bools:
        b = _bools(other)
        return Bools(self.must & b.must, self.may & b.may)

    __rand__ = __and__

    def __or__(self, other: Any) -> Bools:
        b = _bools(other)
        return Bools(self.must | b.must, self.may | b.may)

    __ror__ = __or__

    def __invert__(self) -> Bools:
        return Bools(~self.may, ~self.must)

    def __xor__(self, other: Any) -> Bools:
        b = _bools(other)
        return Bools((self.must & ~b.may) | (~self.may & b.must), (self.may & ~b.must) | (~self.must & b.may))

    __rxor__ = __xor__

    def __eq__(self, other: Any) -> Bools:  # type: ignore[override]
        return ~(self ^ other)

    def __ne__(self, other: Any) -> Bools:  # type: ignore[override]
        return self ^ other

    __hash__ = None  # type: ignore[assignment]

    def logical_and(self, other: Any) -> Bools:
        return self & other

    def logical_or(self, other: Any) -> Bools:
        return self | other

    def logical_not(self) -> Bools:
        return ~self

    def bool(self) -> Bools:
        return self

    def __bool__(self) -> bool:
        raise Unbounded("Python's if/and/or on a comparison (use &, |, torch.where)")

    def __getattr__(self, name: str) -> Any:
        raise Unbounded(f"the tensor method .{name}() on a comparison")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def _where(cond: Any, a: Any, b: Any) -> Ints | Bools:
    c = _bools(cond)
    if isinstance(a, Bools) or isinstance(b, Bools) or _is_bool(a) or _is_bool(b):
        x, y = _bools(a), _bools(b)
        must = torch.where(c.must, x.must, torch.where(~c.may, y.must, x.must & y.must))
        may = torch.where(c.must, x.may, torch.where(~c.may, y.may, x.may | y.may))
        return Bools(must, may)
    x, y = _ints(a)._read(), _ints(b)._read()
    lo = torch.where(c.must, x.lo, torch.where(~c.may, y.lo, torch.minimum(x.lo, y.lo)))
    hi = torch.where(c.must, x.hi, torch.where(~c.may, y.hi, torch.maximum(x.hi, y.hi)))
    return Ints(lo, hi)


def _is_bool(x: Any) -> bool:
    return isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.dtype == torch.bool)


def _index(table: Any, index: Any) -> Ints | Bools:
    """``table[index]`` for a 1-D table (a document's id per position, say): the least and
    largest entry over a range holding the index's, an aligned power-of-two run of the table."""
    if not isinstance(table, torch.Tensor) or table.dim() != 1 or not isinstance(index, Ints):
        raise Unbounded("indexing other than a 1-D tensor by a position")
    index._read()
    lo, hi = index.lo.clamp(0, len(table) - 1), index.hi.clamp(0, len(table) - 1)
    low, high, offsets = _pyramid(table)
    level = _bit_length(lo ^ hi)  # the smallest aligned run holding both ends
    at = offsets[level] + (lo >> level)
    if table.dtype == torch.bool:
        return Bools(low[at].bool(), high[at].bool())
    return Ints(low[at], high[at])


_PYRAMIDS: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _pyramid(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Least and largest entry of every aligned run of 1, 2, 4, ... entries, level after level
    in one tensor each, and where each level starts (kept for the count, with the table)."""
    held = _PYRAMIDS.get(id(table))
    if held is not None and held[0] is table:
        return held[1:]
    low, high = table.long(), table.long()
    lows, highs = [low], [high]
    while len(low) > 1:
        if len(low) % 2:
            low, high = torch.cat([low, low[-1:]]), torch.cat([high, high[-1:]])
        low, high = torch.minimum(low[0::2], low[1::2]), torch.maximum(high[0::2], high[1::2])
        lows.append(low)
        highs.append(high)
    sizes = torch.tensor([0] + [len(x) for x in lows])
    offsets = sizes.cumsum(0)[:-1]
    # the levels past the last are never asked for: a range within the table is within its top
    _PYRAMIDS[id(table)] = (table, torch.cat(lows), torch.cat(highs), offsets)
    return _PYRAMIDS[id(table)][1:]


def _bit_length(x: torch.Tensor) -> torch.Tensor:
    """Bits of non-negative int64 values (0 for 0, 1 for 1, 2 for 2 and 3, ...)."""
    bits, y = torch.zeros_like(x), x
    for shift in (32, 16, 8, 4, 2, 1):
        big = y >= (1 << shift)
        bits = bits + big * shift
        y = torch.where(big, y >> shift, y)
    return bits + (y > 0).long()


# torch functions and Tensor methods by name (``__sub__`` as ``sub``), and the method of bounds each is
_OPS = {
    **{n: "__add__" for n in ("add",)},
    **{n: "__sub__" for n in ("sub", "subtract")},
    **{n: "__mul__" for n in ("mul", "multiply")},
    **{n: "__floordiv__" for n in ("floordiv", "floor_divide")},
    **{n: "__mod__" for n in ("mod", "remainder")},
    **{n: "__lt__" for n in ("lt", "less")},
    **{n: "__le__" for n in ("le", "less_equal")},
    **{n: "__gt__" for n in ("gt", "greater")},
    **{n: "__ge__" for n in ("ge", "greater_equal")},
    **{n: "__eq__" for n in ("eq",)},
    **{n: "__ne__" for n in ("ne", "not_equal")},
    **{n: "__and__" for n in ("and", "bitwise_and", "logical_and")},
    **{n: "__or__" for n in ("or", "bitwise_or", "logical_or")},
    **{n: "__xor__" for n in ("xor", "bitwise_xor", "logical_xor")},
}
_UNARY = {"abs": "abs", "neg": "__neg__", "negative": "__neg__", "invert": "__invert__", "bitwise_not": "__invert__"}
_UNARY |= {"logical_not": "__invert__", "clamp": "clamp", "clamp_min": "clamp_min", "clamp_max": "clamp_max"}


def _dispatch(func, args: tuple, kwargs: dict) -> Any:
    name = getattr(func, "__name__", str(func)).strip("_")
    if name == "getitem":
        return _index(*args)
    if name == "where" and len(args) == 3:
        return _where(*args)
    if name in ("minimum", "maximum", "min", "max") and len(args) == 2 and not kwargs:
        return _minmax(args[0], args[1], torch.minimum if name.startswith("min") else torch.maximum)
    if name in _UNARY:
        return getattr(_lift(args[0]), _UNARY[name])(*args[1:], **kwargs)
    if name in _OPS and len(args) == 2 and not kwargs:
        return _apply(_OPS[name], args[0], args[1])
    if name.startswith("r") and name[1:] in _OPS and len(args) == 2:  # Tensor.__rsub__(t, x) is x - t
        return _apply(_OPS[name[1:]], args[1], args[0])
    raise Unbounded(f"torch.{name}")


def _lift(x: Any) -> Ints | Bools:
    if isinstance(x, (Ints, Bools)):
        return x
    return _bools(x) if _is_bool(x) else _ints(x)


def _apply(method: str, a: Any, b: Any) -> Any:
    left = _lift(a)
    if method not in type(left).__dict__:  # object's own __lt__ answers NotImplemented
        raise Unbounded(f"{method.strip('_')} on {'booleans' if isinstance(left, Bools) else 'positions'}")
    return getattr(left, method)(b)


# --- counting --------------------------------------------------------------------------


def _classify(mask_mod: MaskMod, h: Any, q0, qn, k0, kn) -> Bools:
    """Whether every pair of each tile is kept (``must``) and whether any is (``may``)."""
    b = torch.zeros((), dtype=torch.long)
    try:
        out = _bools(mask_mod(b, h, Ints(q0, q0 + qn - 1), Ints(k0, k0 + kn - 1)))
    except Unbounded:
        raise
    except Exception as exc:  # what it does to bounds fails: evaluated pair by pair, its own error there
        raise Unbounded(f"an operation bounds cannot take ({type(exc).__name__}: {exc})".splitlines()[0]) from None
    shape = q0.shape
    return Bools(out.must.expand(shape), out.may.expand(shape))


def _leaf_pairs(mask_mod: MaskMod, h: torch.Tensor, q0, k0, seq_len: int) -> int:
    """Pairs kept in LEAF x LEAF tiles, every pair evaluated (a few tiles at a time)."""
    offs = torch.arange(LEAF)
    b = torch.zeros((), dtype=torch.long)
    total = 0
    step = max(1, PAIRS_PER_STEP // (LEAF * LEAF))
    for s in range(0, len(q0), step):
        check_time()
        q = (q0[s : s + step, None] + offs)[:, :, None]
        kv = (k0[s : s + step, None] + offs)[:, None, :]
        inside = (q < seq_len) & (kv < seq_len)
        keep = torch.as_tensor(mask_mod(b, h, q.clamp(max=seq_len - 1), kv.clamp(max=seq_len - 1)))
        total += int((keep.to(torch.bool) & inside).sum())
    return total


def reads_head(mask_mod: MaskMod, seq_len: int, num_heads: int) -> bool:
    """Whether the key sets may depend on the head: the mask_mod, called on bounds, read ``h``.
    (Ones that never read it are the same for every head, whatever the length.)"""
    h = Ints(torch.tensor(0), torch.tensor(num_heads - 1))
    zero = torch.zeros(1, dtype=torch.long)
    _classify(mask_mod, h, zero, torch.tensor([seq_len]), zero, torch.tensor([seq_len]))
    return h.seen


def count_head(mask_mod: MaskMod, h: int, seq_len: int) -> int:
    """Pairs kept by head ``h``: full tiles counted whole, empty ones skipped, partial ones cut
    in four, down to LEAF x LEAF tiles evaluated pair by pair. Raises Unbounded."""
    head = torch.tensor(h)
    top = LEAF
    while top < seq_len:
        top *= 2
    stack = [(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), top)]
    total = 0
    while stack:
        check_time()
        q0, k0, size = stack.pop()
        qn, kn = (q0 + size).clamp(max=seq_len) - q0, (k0 + size).clamp(max=seq_len) - k0
        kept = _classify(mask_mod, head, q0, qn, k0, kn)
        total += int((qn * kn)[kept.must].sum())
        partial = kept.may & ~kept.must
        q0, k0 = q0[partial], k0[partial]
        if not len(q0):
            continue
        if size <= LEAF:
            total += _leaf_pairs(mask_mod, head, q0, k0, seq_len)
            continue
        half = size // 2
        children = [(q0 + dq, k0 + dk) for dq in (0, half) for dk in (0, half)]
        q1 = torch.cat([c[0] for c in children])
        k1 = torch.cat([c[1] for c in children])
        inside = (q1 < seq_len) & (k1 < seq_len)
        q1, k1 = q1[inside], k1[inside]
        for s in range(0, len(q1), TILES_PER_STEP):
            stack.append((q1[s : s + TILES_PER_STEP], k1[s : s + TILES_PER_STEP], half))
    return total


def count_blocks(mask_mod: MaskMod, seq_len: int, num_heads: int) -> int:
    """Pairs in the key sets of every head, by tiles (see the module); one head's count for
    all where the mask_mod never reads the head. Raises Unbounded."""
    try:
        if not reads_head(mask_mod, seq_len, num_heads):
            return num_heads * count_head(mask_mod, 0, seq_len)
        return sum(count_head(mask_mod, h, seq_len) for h in range(num_heads))
    finally:
        _PYRAMIDS.clear()
