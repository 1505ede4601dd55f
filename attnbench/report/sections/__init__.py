"""The report's sections, one module each, named by what it shows; ``SECTIONS`` lists them in
report order. A section is a function ``(doc, machine) -> None`` that writes one machine's
part into a ``Doc`` (``attnbench.report.document``); every number comes from that machine's
rows. The five seed reports of ``docs/semantics.md`` keep their number in the section title.

Table columns follow the seed tables, in the seeds' order; columns a seed lacked (efficiency,
NVML readings, output match) come after them. A table whose rows are missing says which
``attnbench`` command produces them.
"""

from __future__ import annotations

from collections.abc import Callable

from attnbench.report.document import Doc, Machine
from attnbench.report.sections.block_sparse_multi_gpu import block_sparse_multi_gpu
from attnbench.report.sections.capacity import capacity
from attnbench.report.sections.data_parallel import data_parallel_speedup
from attnbench.report.sections.dilation import dilation_configurations
from attnbench.report.sections.environment import environment
from attnbench.report.sections.extreme_length import extreme_length
from attnbench.report.sections.figures import figures
from attnbench.report.sections.models import models
from attnbench.report.sections.ring_vs_single_gpu import ring_vs_single_gpu
from attnbench.report.sections.summary import executive_summary
from attnbench.report.training import training_section

# Sections in report order: (anchor title, seed file it regenerates or None, function).
SECTIONS: list[tuple[str, str | None, Callable[[Doc, Machine], None]]] = [
    ("Executive summary", None, executive_summary),
    ("Report 000: block-sparse multi-GPU analysis", "000_d442633bf7a6a946.txt", block_sparse_multi_gpu),
    (
        "Report 001: multi-GPU capabilities (single GPU vs data parallel)",
        "001_f351c47f35f6c2cf.txt",
        data_parallel_speedup,
    ),
    ("Report 002: extreme sequence length", "002_eb8e9fa29ff73d94.txt", extreme_length),
    ("Report 003: dilated configurations and multi-GPU scaling", "003_44f2437c03de4e52.txt", dilation_configurations),
    ("Report 004: ring attention, single GPU vs multi-GPU", "004_e2d2d58acab56c17.txt", ring_vs_single_gpu),
    ("Training: forward plus backward", None, training_section),
    ("Model shapes: model presets beside the seeds' shape", None, models),
    ("Capacity prediction", None, capacity),
    ("Plots", None, figures),
    ("Environment and commands (appendix)", None, environment),
]
