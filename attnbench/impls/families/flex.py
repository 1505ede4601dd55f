"""FlexAttention over any ``mask_mod``: ``flex``. Its code: ``impls/flex.py``."""

from __future__ import annotations

from attnbench.impls import register
from attnbench.impls.entry import ImplSpec, Lazy, Param

register(
    ImplSpec(
        name="flex",
        factory=Lazy("attnbench.impls.flex:build_flex"),
        summary="FlexAttention (compiled on CUDA) over any mask_mod(b, h, q_idx, kv_idx): --param mask=pkg.module:mask_fn",
        params=(
            Param(
                "mask",
                None,
                "mask_mod as pkg.module:function (e.g. attnbench.masks:sliding_window)",
                kind="str",
                names_code=True,
            ),
            Param(
                "mask_args",
                None,
                "keyword arguments for a function that returns the mask_mod, e.g. window_size=256",
                kind="str",
                recorded_at_default=False,
            ),
        ),
        verify_configs=(
            {"mask": "attnbench.masks:sliding_window", "mask_args": "window_size=48"},
            {"mask": "attnbench.masks:document", "mask_args": "doc_len=80"},
        ),
    )
)
