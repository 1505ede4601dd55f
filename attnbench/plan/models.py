"""Attention shapes of well-known open models, so ``--model NAME`` measures attention as that
model runs it: query heads, key/value heads (grouped-query attention where fewer), head
dimension and the causal mask. A profile adds its own under ``[models.NAME]``; options given
beside a preset override its values (``plan.build_plan``).

The numbers are the models' published configurations (``num_attention_heads``,
``num_key_value_heads``, ``head_dim`` or hidden size over heads). Only the attention call is
modelled: one layer's softmax attention over the whole sequence, as the models' global
layers compute it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnbench.errors import AttnbenchError
from attnbench.units import brief

if TYPE_CHECKING:
    from attnbench.plan.settings import SettingValues

MODEL_KEYS = ("heads", "kv_heads", "head_dim", "causal")


@dataclass(frozen=True)
class ModelShape:
    name: str
    heads: int  # query heads
    kv_heads: int  # key/value heads, shared by heads / kv_heads query heads each
    head_dim: int
    causal: bool
    about: str  # where the shape comes from, in words

    def settings(self) -> SettingValues:
        """The plan settings the preset fills."""
        return {"heads": self.heads, "kv_heads": self.kv_heads, "head_dim": self.head_dim, "causal": self.causal}

    @property
    def shape_text(self) -> str:
        return f"{self.heads} / {self.kv_heads} / {self.head_dim}"


PRESETS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("llama3-8b", 32, 8, 128, True, "Llama 3 and 3.1 8B (hidden 4096)"),
        ModelShape("llama3-70b", 64, 8, 128, True, "Llama 3 and 3.1 70B (hidden 8192)"),
        ModelShape("llama3-405b", 128, 8, 128, True, "Llama 3.1 405B (hidden 16384)"),
        ModelShape("llama3.2-1b", 32, 8, 64, True, "Llama 3.2 1B (hidden 2048, head dim 64)"),
        ModelShape("qwen2.5-7b", 28, 4, 128, True, "Qwen2.5 7B (hidden 3584)"),
        ModelShape("gemma-2b", 8, 1, 256, True, "Gemma 2B: multi-query, head dim 256"),
        ModelShape("seed", 8, 8, 64, False, "the seed reports' shape and attnbench's defaults: no mask"),
    )
}


def parse_table(table: Any, where: str) -> dict[str, ModelShape]:
    """A profile's ``[models.NAME]`` tables (heads, kv_heads, head_dim, causal, all given) as
    presets; a bad table is an error naming it and the key."""
    if not isinstance(table, dict) or not all(isinstance(v, dict) for v in table.values()):
        raise AttnbenchError(f"{where}: write models as [models.NAME] tables with {', '.join(MODEL_KEYS)}")
    out = {}
    for name, keys in table.items():
        missing = [k for k in MODEL_KEYS if k not in keys]
        unknown = sorted(set(keys) - set(MODEL_KEYS))
        if missing or unknown:
            bad = f"missing {missing[0]!r}" if missing else f"unknown key {unknown[0]!r}"
            raise AttnbenchError(f"{where}: [models.{name}] {bad}; a model names {', '.join(MODEL_KEYS)}")
        counts = [keys[k] for k in ("heads", "kv_heads", "head_dim")]
        if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in counts):
            raise AttnbenchError(f"{where}: [models.{name}] heads, kv_heads and head_dim must be positive integers")
        if not isinstance(keys["causal"], bool):
            raise AttnbenchError(f"{where}: [models.{name}] causal must be true or false")
        if keys["heads"] % keys["kv_heads"]:
            raise AttnbenchError(
                f"{where}: [models.{name}] heads {keys['heads']} is not a multiple of kv_heads {keys['kv_heads']}: "
                "query heads share key/value heads in equal groups"
            )
        out[name] = ModelShape(name, keys["heads"], keys["kv_heads"], keys["head_dim"], keys["causal"], where)
    return out


def filled(settings: SettingValues, own: dict[str, ModelShape] | None = None) -> SettingValues:
    """Settings of one level (profile, sweep entry, command line) with the values of the
    model preset it names under its own keys: what the level says itself wins."""
    if not settings.get("model"):
        return settings
    return {**lookup(settings["model"], own).settings(), **settings}


def lookup(name: str, own: dict[str, ModelShape] | None = None) -> ModelShape:
    """A preset by name: the profile's own first, then the built-in ones."""
    table = {**PRESETS, **(own or {})}
    if name not in table:
        raise AttnbenchError(f"unknown model {brief(name)}: choose one of {', '.join(table)} (see `attnbench models`)")
    return table[name]
