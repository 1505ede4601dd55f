"""The report's figures drawn as PNG: in this process, or, where a report has many, in worker
processes while this one goes on with its tables.

Drawing is most of a report's time (some 0.7 s of CPU a figure, 25 figures for the committed
results), each figure apart from the others. A figure made here is handed to a worker pickled
(the same figure: it draws the same bytes) and closed here at once, so no more than one is
open in this process; its bytes are collected when the report is complete (``finish``).
"""

from __future__ import annotations

import os
import pickle
import signal
from concurrent.futures import Future, ProcessPoolExecutor
from multiprocessing import get_context
from typing import Any

DPI = 100  # a figure's pixels per inch in its PNG

# Figures a report must expect before workers pay for their start (a fresh interpreter and
# matplotlib each, about a second): a report of one machine draws in this process.
WORKERS_FROM = 6
MAX_WORKERS = 8


def cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig, missing_glyphs: set[str] | None = None) -> bytes:
    """The figure as PNG bytes, and the figure freed: a report of many figures holds one open
    at a time. A character the font has no glyph for (a label's) is added to
    ``missing_glyphs`` for one line of the report's, not warned about from matplotlib's source."""
    import io
    import re
    import warnings

    buf = io.BytesIO()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig.savefig(buf, format="png", dpi=DPI)
    pyplot().close(fig)
    for w in caught:
        glyph = re.match(r"Glyph (\d+) .*missing from font", str(w.message))
        if glyph is None:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        elif missing_glyphs is not None:
            missing_glyphs.add(chr(int(glyph.group(1))))
    return buf.getvalue()


class Drawing:
    """PNG files of figures handed over one by one (``png``), the bytes or the promise of them;
    ``finish`` collects them. ``expected``: about how many figures the report will draw."""

    def __init__(self, expected: int = 0) -> None:
        self.workers = min(cpus(), MAX_WORKERS) if expected >= WORKERS_FROM and cpus() > 1 else 0
        self.missing_glyphs: set[str] = set()  # characters of labels the figures' font cannot draw
        self._pool: ProcessPoolExecutor | None = None

    def png(self, fig: Any) -> bytes | Future:
        """The figure's PNG bytes, drawn here or by a worker; the figure is closed either way."""
        if not self.workers:
            return png(fig, self.missing_glyphs)
        blob = pickle.dumps(fig)
        pyplot().close(fig)
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"), initializer=_worker)
        return self._pool.submit(_drawn, blob)

    def finish(self, figures: list[tuple[str, bytes | Future]]) -> None:
        """Every figure of ``figures`` as its bytes, in place, once its worker has drawn it."""
        for i, (file, drawn) in enumerate(figures):
            if isinstance(drawn, Future):
                data, glyphs = drawn.result()
                figures[i] = (file, data)
                self.missing_glyphs |= glyphs
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def close(self) -> None:
        """Stop the workers without drawing what is left (after an error, an interrupt or a
        SIGTERM: a figure a worker has started would otherwise be drawn to the end)."""
        if self._pool is None:
            return
        pool, self._pool = self._pool, None
        stop = getattr(pool, "terminate_workers", None)  # Python 3.14
        if stop is not None:
            stop()
        else:  # before 3.14 no public way: the executor's own processes, ended as that does
            for process in list((pool._processes or {}).values()):
                process.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def _worker() -> None:
    # Ctrl-C reaches every process of the terminal's group: a worker ends at once and says
    # nothing (no traceback of its own), and the parent says "interrupted" and lets the others go
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))


def _drawn(blob: bytes) -> tuple[bytes, set[str]]:
    """A pickled figure's PNG bytes and the characters its font had no glyph for."""
    glyphs: set[str] = set()
    return png(pickle.loads(blob), glyphs), glyphs
