"""The one registration idiom: modules of a package register themselves when imported, and a
registry imports its package whole the first time it is read."""

import sys

import pytest

from attnbench.registry import Registry, import_all

PLUGINS = "zz_plugins"


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package of three modules, one in a subpackage, each registering its own name into
    ``zz_plugins.FOUND`` as it is imported."""
    root = tmp_path / PLUGINS
    (root / "deep").mkdir(parents=True)
    (root / "__init__.py").write_text(
        f"from attnbench.registry import Registry\nFOUND = Registry('plugin', {PLUGINS!r}, first='zeta')\n"
    )
    for module in ("alpha.py", "zeta.py", "deep/__init__.py", "deep/beta.py"):
        name = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        (root / module).write_text(f"from {PLUGINS} import FOUND\nFOUND.register({name!r}, {name!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield __import__(PLUGINS)
    for name in [m for m in sys.modules if m == PLUGINS or m.startswith(PLUGINS + ".")]:
        del sys.modules[name]


def test_a_registry_imports_its_package_whole_on_first_read_first_then_by_name(package):
    assert f"{PLUGINS}.alpha" not in sys.modules, "nothing is imported before the entries are read"
    assert list(package.FOUND.entries()) == ["zeta", "alpha", "deep", "deep.beta"]
    import_all(PLUGINS)  # imported once: nothing registers twice
    assert list(package.FOUND.entries()) == ["zeta", "alpha", "deep", "deep.beta"]


def test_a_second_entry_under_a_taken_name_is_refused():
    registry: Registry[object] = Registry("widget", "attnbench.registry")
    first = object()
    assert registry.register("w", first) is first and registry.register("w", first) is first
    with pytest.raises(ValueError, match="widget 'w' registered twice"):
        registry.register("w", object())
