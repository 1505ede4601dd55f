"""The Typer app every command registers on, the two consoles commands print to, and the
short forms of values that several commands show."""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from attnbench.errors import RunInterrupted


def _without_flag_metavars(params: list) -> list:
    """typer shows a flag's type as if it took a value (`--resume <bool>`); a flag takes none."""
    for param in params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    return params


class _Command(TyperCommand):
    def get_params(self, ctx):
        return _without_flag_metavars(super().get_params(ctx))


class _Group(TyperGroup):
    def get_params(self, ctx):
        return _without_flag_metavars(super().get_params(ctx))

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:  # past typer to main(), which tells Ctrl-C from SIGTERM
            raise RunInterrupted() from exc


class _App(typer.Typer):
    """Every command is a _Command."""

    def command(self, *args, **kwargs):
        return super().command(*args, cls=kwargs.pop("cls", None) or _Command, **kwargs)


app = _App(
    cls=_Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="How long a sequence can an attention implementation handle, how fast, with how much memory per GPU.",
)


def _print_version(value: bool) -> None:
    if value:
        from attnbench import __version__

        print(f"attnbench {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit"),
    ] = None,
) -> None:
    """How long a sequence can an attention implementation handle, how fast, with how much memory per GPU."""


# Logs and CI captures are not terminals: give tables room instead of rich's 80 columns.
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)  # "pkg.mod:x:" stays text


def show(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def config_short(config: dict[str, Any]) -> str:
    return (
        " ".join(f"{k}={show(v)}" for k, v in config.items() if k != "max_chunk_tokens" and v not in (None, "")) or "-"
    )
