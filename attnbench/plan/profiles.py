"""Profiles: TOML files of settings and series (``[[sweep]]`` and ``[[speedup]]`` tables, a
profile's own ``[models.NAME]`` presets and ``parts``), found by path or by name and read with
every key checked before torch is imported."""

from __future__ import annotations

import tomllib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench.errors import AttnbenchError
from attnbench.plan import models
from attnbench.plan.settings import (
    SPEEDUP_ONLY,
    SPEEDUP_SHARED,
    SPEEDUP_TIMING,
    SWEEP_KEYS,
    SettingValues,
    parse_part,
    parse_settings,
)
from attnbench.units import brief

# Installed, the profiles lie inside the package (setup.py); in a clone, at the repository's top.
_INSTALLED_PROFILES = Path(__file__).resolve().parent.parent / "profiles"
PROFILE_DIR = _INSTALLED_PROFILES if _INSTALLED_PROFILES.is_dir() else _INSTALLED_PROFILES.parent.parent / "profiles"


@dataclass(frozen=True)
class Profile:
    """A profile as read, every key checked."""

    name: str  # the file's stem
    description: str
    settings: SettingValues  # its top level, parsed
    entries: list[SettingValues]  # [[sweep]] tables
    verify: bool
    speedups: list[SettingValues]  # [[speedup]] tables
    own_models: dict[str, models.ModelShape]  # its own [models.NAME] presets
    parts: tuple[str, ...]  # its parts in order (empty: it runs whole)


def resolve_profile_path(profile: str) -> Path:
    """The profile's file: a path as given, else a name under profiles/; a path that is not a
    regular file (a directory, a FIFO) is refused, never read."""
    path = Path(profile)
    known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.toml")))
    if path.exists() and not path.is_file():
        raise AttnbenchError(f"profile {path} is not a file (a directory?): give a TOML file or one of {known}")
    if path.exists():
        return path
    candidate = PROFILE_DIR / f"{profile}.toml"
    if candidate.is_file():
        return candidate
    raise AttnbenchError(f"profile {brief(profile)} not found: give a TOML file or one of {known}")


def profile_models(profile: str) -> dict[str, models.ModelShape]:
    """A profile's own model presets (``[models.NAME]`` tables)."""
    return read_profile(profile).own_models


def read_profile(profile: str) -> Profile:
    """The profile named by path or by name, every key of its top level and tables checked;
    an implementation's own parameters are checked once the series are built."""
    path = resolve_profile_path(profile)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise AttnbenchError(f"profile {path}: not valid TOML ({exc})") from None
    except OSError as exc:
        raise AttnbenchError(f"cannot read profile {path} ({exc.strerror}): check its permissions") from None
    description = data.pop("description", "")
    verify = data.pop("verify", True)
    parts = data.pop("parts", [])
    if not isinstance(parts, list) or len(set(parts)) != len(parts):
        raise AttnbenchError(f"profile {path}: 'parts' must list each part once, in the order they run")
    try:
        parts = [parse_part(p) for p in parts]
    except ValueError as exc:
        raise AttnbenchError(f"profile {path}: 'parts' names {exc}") from None
    if not isinstance(verify, bool):
        raise AttnbenchError(f"profile {path}: 'verify' must be true or false")
    entries = data.pop("sweep", [])
    speedups = data.pop("speedup", [])
    own_models = models.parse_table(data.pop("models", {}), f"profile {path}")
    for what in (entries, speedups):
        if not isinstance(what, list) or not all(isinstance(e, dict) for e in what):
            raise AttnbenchError(f"profile {path}: [[sweep]] and [[speedup]] must be tables with an 'impl' key")
    if not entries and not speedups:
        raise AttnbenchError(f"profile {path}: needs at least one [[sweep]] or [[speedup]] table with an 'impl' key")
    unknown = sorted(set(data) - set(SWEEP_KEYS))
    if unknown:
        raise AttnbenchError(f"profile {path}: unknown key {brief(unknown[0])} (settings: {', '.join(SWEEP_KEYS)})")
    for i, entry in enumerate(entries, 1):
        _check_entry(entry, f"profile {path.stem}, sweep {i}", SWEEP_KEYS)
    for i, entry in enumerate(speedups, 1):
        _check_entry(entry, f"profile {path.stem}, speedup {i}", SPEEDUP_SHARED + SPEEDUP_TIMING + SPEEDUP_ONLY)
    settings = parse_settings(data, f"profile {path}")
    return Profile(path.stem, str(description), settings, entries, verify, speedups, own_models, tuple(parts))


def _check_entry(entry: dict[str, Any], where: str, setting_keys: Collection[str]) -> None:
    """What a table's keys must be whatever the implementation: ``impl`` a name, its settings
    of their type and range. Checked while the profile is read, before torch is imported;
    the implementation's own parameters are checked once it is known (``split_entry``)."""
    impl = entry.get("impl")
    if not isinstance(impl, str) or not impl.strip():
        raise AttnbenchError(
            f"{where}: 'impl' must be an implementation's name, e.g. impl = \"sdpa\" (see `attnbench list`), "
            f"got {brief(impl)}"
        )
    parse_settings({k: v for k, v in entry.items() if k in setting_keys}, where)
