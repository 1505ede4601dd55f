"""What a sweep will run: settings from built-in defaults, a TOML profile and CLI flags.

Precedence, lowest first: built-in defaults, the profile's top-level settings, the profile
entry (``[[sweep]]`` or ``[[speedup]]``), flags given on the command line. A model preset
(``model``: built in, or a profile's ``[models.NAME]``) fills heads, kv_heads, head_dim and
causal at the level that names it, under that level's own keys. Every key is checked: an
unknown key or a wrong type is an error that names the key. One settings family serves every
kind of series (max-seq, points, speedup, or a kind registered in ``attnbench.sweeps.kinds``);
what a kind does with them is that kind's business.

``settings`` holds the settings and their parsers, ``profiles`` reads a profile, ``series``
builds the plan's series from both and the command line, ``models`` holds the model presets.
Every name a caller needs is imported here.
"""

from attnbench.plan.profiles import PROFILE_DIR, Profile, profile_models, read_profile, resolve_profile_path
from attnbench.plan.series import Plan, Series, build_plan, select_parts, speedup_series, split_entry
from attnbench.plan.settings import (
    COMMAND_LINE,
    SEED_CASES,
    SETTING_PARSERS,
    SWEEP_KEYS,
    Case,
    Settings,
    parse_cases,
    parse_names,
    parse_settings,
)

__all__ = [
    "COMMAND_LINE",
    "PROFILE_DIR",
    "SEED_CASES",
    "SETTING_PARSERS",
    "SWEEP_KEYS",
    "Case",
    "Plan",
    "Profile",
    "Series",
    "Settings",
    "build_plan",
    "parse_cases",
    "parse_names",
    "parse_settings",
    "profile_models",
    "read_profile",
    "resolve_profile_path",
    "select_parts",
    "speedup_series",
    "split_entry",
]
