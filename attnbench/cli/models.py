"""`attnbench models`: the model presets ``--model NAME`` fills a workload from."""

from __future__ import annotations

from typing import Annotated, Optional

import typer
from rich.table import Table

from attnbench.cli.base import app, console


@app.command("models", order=30)
def list_models(
    profile: Annotated[
        Optional[str], typer.Option("--profile", help="also list this profile's own [models.NAME] tables")
    ] = None,
) -> None:
    """The model presets: query heads, key/value heads, head dimension and mask (use with --model NAME)."""
    from attnbench.plan import models

    own = _profile_models(profile) if profile else {}
    t = Table(title="model presets (--model NAME; options given beside it override its values)")
    for col in ("model", "heads", "kv heads", "query heads per kv head", "head dim", "mask", "shape of"):
        t.add_column(col)
    for m in {**models.PRESETS, **own}.values():
        t.add_row(
            m.name,
            str(m.heads),
            str(m.kv_heads),
            str(m.heads // m.kv_heads),
            str(m.head_dim),
            "causal" if m.causal else "none",
            m.about,
        )
    console.print(t)


def _profile_models(profile: str) -> dict:
    """A profile's own presets, checked with the whole profile (the plan imports torch: only
    a profile pays for it; the built-in presets are listed without it)."""
    from attnbench.plan import profile_models

    return profile_models(profile)
