"""The README is how users find and copy things: every profile and implementation is named
there, and every concrete `attnbench` command it shows parses against the real CLI."""

import re
import shlex

import pytest
import typer

from attnbench import impls
from attnbench.cli import app
from attnbench.plan import PROFILE_DIR

from conftest import ROOT

README = (ROOT / "README.md").read_text()


def readme_commands() -> list[str]:
    """Concrete commands: code-block lines (continuations joined, comments dropped) and inline
    code spans that start with `attnbench `; synopses with [optional] or ... parts are left out."""
    found = []
    for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", README, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            found.append(line.split("  #")[0].strip())
    found += re.findall(r"`(attnbench [^`]+)`", README)
    return list(dict.fromkeys(c for c in found if c.startswith("attnbench ") and "[" not in c and "..." not in c))


def test_the_readme_names_every_committed_profile_and_every_implementation():
    assert [p.stem for p in sorted(PROFILE_DIR.glob("*.toml")) if f"| `{p.stem}` |" not in README] == []
    assert [name for name in impls.names() if f"`{name}`" not in README] == []


def test_the_readme_shows_commands():
    assert len(readme_commands()) > 20


@pytest.mark.parametrize("command", readme_commands())
def test_every_command_the_readme_shows_parses(command):
    words = shlex.split(command)
    commands = typer.main.get_command(app).commands
    assert words[1] in commands, f"no command {words[1]!r}"
    if len(words) > 2:  # a bare `attnbench NAME` in prose names the command, not a call
        commands[words[1]].make_context(words[1], words[2:])  # raises on an unknown option or a missing value
