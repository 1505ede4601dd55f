"""The README is how users find and copy things: short enough to read in five minutes, every
implementation named there and every committed profile one link away in profiles.md; every
concrete `attnbench` command it and the commands page show parses against the real CLI."""

import re
import shlex

import pytest
import typer

from attnbench import impls
from attnbench.cli import app
from attnbench.plan import PROFILE_DIR

from conftest import ROOT

README = (ROOT / "README.md").read_text()
# the README's commands and examples in full, one link away
COMMANDS_PAGE = (ROOT / "docs" / "reference" / "commands.md").read_text()
PROFILES_PAGE = (ROOT / "docs" / "reference" / "profiles.md").read_text()
# what a newcomer reads in five minutes
README_MAX_LINES = 200


def shown_commands(text: str) -> list[str]:
    """Concrete commands: shell code-block lines (continuations joined, comments dropped) and
    inline code spans that start with `attnbench `; synopses with [optional] or ... parts are
    left out. A block of another language (```text, a report's output) is not a command."""
    found = []
    for lang, block in re.findall(r"```(\w*)\n(.*?)```", text, re.S):
        if lang in ("", "bash", "sh"):
            for line in block.replace("\\\n", " ").splitlines():
                found.append(line.split("  #")[0].strip())
    found += re.findall(r"`(attnbench [^`]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return list(dict.fromkeys(c for c in found if c.startswith("attnbench ") and "[" not in c and "..." not in c))


def readme_commands() -> list[str]:
    return list(dict.fromkeys(shown_commands(README) + shown_commands(COMMANDS_PAGE)))


def test_the_readme_is_short_and_names_every_implementation():
    assert len(README.splitlines()) <= README_MAX_LINES
    assert [name for name in impls.names() if f"`{name}`" not in README] == []


def test_the_readme_avoids_the_words_a_newcomer_does_not_know_or_explains_them():
    text = " ".join(README.lower().split())
    assert [w for w in ("granularity", "bracketed", "seed report") if w in text] == []
    assert "floor" not in text or "the *floor*, the least any attention must hold" in text


def test_every_committed_profile_is_in_the_profile_table_the_readme_links():
    assert "docs/reference/profiles.md" in README
    assert [p.stem for p in sorted(PROFILE_DIR.glob("*.toml")) if f"| `{p.stem}` |" not in PROFILES_PAGE] == []


def test_the_readme_and_the_commands_page_show_commands():
    assert len(shown_commands(README)) >= 5 and len(readme_commands()) > 20
    assert "docs/reference/commands.md" in README


@pytest.mark.parametrize("command", readme_commands())
def test_every_command_the_readme_shows_parses(command):
    words = shlex.split(command)
    commands = typer.main.get_command(app).commands
    assert words[1] in commands, f"no command {words[1]!r}"
    if len(words) > 2:  # a bare `attnbench NAME` in prose names the command, not a call
        commands[words[1]].make_context(words[1], words[2:])  # raises on an unknown option or a missing value
