"""The package's layering, read from its source with ``ast`` (function-level imports included):
no import cycle, no import from a higher layer, no private name taken from another module,
and the read-only commands never import torch."""

import ast
import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attnbench"

ARCHITECTURE = ROOT / "docs" / "design" / "architecture.md"


def doc_layers(text: str) -> list[tuple[str, list[str]]]:
    """The layers of docs/design/architecture.md ("## Layers"), lowest first: (layer, module prefixes),
    read from the names that start each numbered item: `attnbench` (the package root), `name`
    (the module attnbench.name) or `name/` (the folder attnbench/name/, every module under it)."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. ((?:`[^`]+`(?:, )?)+):", section, re.M)
    layers = []
    for item in items:
        names = re.findall(r"`([^`]+)`", item)
        layers.append((", ".join(names), [n if n == "attnbench" else "attnbench." + n.rstrip("/") for n in names]))
    return layers


# Lowest first: a module imports only from its own layer or those before it. The list in
# docs/design/architecture.md is the rule; a new module is placed there (the test names any that is not).
LAYERS = doc_layers(ARCHITECTURE.read_text())


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> int | None:
    """The layer whose longest listed prefix names ``module``."""
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "attnbench"  # the package root names itself only
            if (module == prefix or inside) and len(prefix) > best:
                best, rank = len(prefix), i
    return rank


def is_package(module: str) -> bool:
    return modules()[module].name == "__init__.py"


def imports(module: str) -> list[tuple[str, list[str], int]]:
    """(imported attnbench module, names taken from it, line) for every import in ``module``."""
    return parse_imports(modules()[module].read_text(), module, is_package(module), set(modules()))


def parse_imports(source: str, module: str, package: bool, known: set[str]) -> list[tuple[str, list[str], int]]:
    found = []
    parent = module if package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):  # every node: imports inside functions too
        if isinstance(node, ast.Import):
            found += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] == "attnbench"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = parent.split(".")[: len(parent.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != "attnbench":
                continue
            names = []
            for alias in node.names:
                if f"{base}.{alias.name}" in known:  # `from attnbench import impls` imports a module
                    found.append((f"{base}.{alias.name}", [], node.lineno))
                else:
                    names.append(alias.name)
            if names:
                found.append((base, names, node.lineno))
    return found


def edges() -> dict[str, set[str]]:
    """Module -> modules it imports; a package's own submodules are its parts, not its dependencies."""
    graph = {m: set() for m in modules()}
    for m in modules():
        for target, _, _ in imports(m):
            if target in modules() and target != m and not (is_package(m) and target.startswith(m + ".")):
                graph[m].add(target)
    return graph


def test_every_module_has_a_layer():
    unplaced = [m for m in modules() if layer_of(m) is None]
    assert not unplaced, f"place these modules in the layer list of docs/design/architecture.md: {unplaced}"


def test_the_layer_list_names_only_modules_that_exist():
    assert len(LAYERS) >= 10, "docs/design/architecture.md's layer list was not read"
    named = [m for _, prefixes in LAYERS for m in prefixes]
    assert [m for m in named if m not in modules()] == []
    assert len(named) == len(set(named)), "a module is in two layers"
    top = {name.split(".")[1] for name in modules() if name.count(".") >= 1}
    assert sorted(top - {m.split(".")[1] for m in named if "." in m}) == [], "every top-level module is named"


# The package root re-exports the public loading API (attnbench.load) and imports it only
# when called, so `import attnbench` stays free of pandas and torch.
FACADE = {("attnbench", "attnbench.api")}


def test_no_module_imports_from_a_higher_layer():
    wrong = []
    for m in modules():
        for target, _, line in imports(m):
            if (m, target) in FACADE:
                continue
            placed = layer_of(m) is not None and layer_of(target) is not None  # the test above names the others
            if target in modules() and placed and layer_of(target) > layer_of(m):
                wrong.append(
                    f"{modules()[m].relative_to(ROOT)}:{line} {m} ({LAYERS[layer_of(m)][0]}) imports "
                    f"{target} ({LAYERS[layer_of(target)][0]})"
                )
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(stack[stack.index(n) :] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles


def test_what_a_lower_layer_reads_of_a_row_names_fields_the_row_has():
    """The capacity model (measure/) reads trial rows without importing results/, a layer above:
    what it reads is declared as protocols, each attribute a field of the row type it stands for."""
    from dataclasses import fields

    from attnbench.measure import capacity
    from attnbench.results import schema

    for protocol, row in (
        (capacity.Trial, schema.Trial),
        (capacity.GpuPeaks, schema.GpuMemory),
        (capacity.Machine, schema.Environment),
    ):
        missing = set(protocol.__annotations__) - {f.name for f in fields(row)}
        assert not missing, f"{protocol.__name__} reads {sorted(missing)}, which {row.__name__} has not"


def test_no_import_cycle():
    cycles = find_cycles(edges())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_private_name_is_taken_from_another_module():
    wrong = [
        f"{modules()[m].relative_to(ROOT)}:{line} takes {', '.join(private)} from {target}"
        for m in modules()
        for target, names, line in imports(m)
        if target != m
        for private in [[n for n in names if n.startswith("_") and not n.startswith("__")]]
        if private
    ]
    assert not wrong, "make these public where they live, or keep them in their module:\n" + "\n".join(wrong)


def test_the_scanner_finds_function_level_relative_and_private_imports():
    source = (
        "import os\nfrom attnbench import impls\n"
        "def f():\n    from ..measure.probe import _hidden, shown\n    import attnbench.units\n"
    )
    known = {"attnbench.impls", "attnbench.measure.probe", "attnbench.units", "attnbench.sweeps.seqpar"}
    assert parse_imports(source, "attnbench.sweeps.seqpar", False, known) == [
        ("attnbench.impls", [], 2),
        ("attnbench.measure.probe", ["_hidden", "shown"], 4),
        ("attnbench.units", [], 5),
    ]
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    assert layer_of("attnbench.impls.dense") == layer_of("attnbench.measure.timing") < layer_of("attnbench.runtime")
    assert layer_of("attnbench.sweeps.seqpar") < layer_of("attnbench.report.sections") < layer_of("attnbench.cli")
    assert layer_of("attnbench.plan") < layer_of("attnbench.sweeps.runner"), "plan imports nothing from sweeps"
    assert layer_of("attnbench.somewhere_new") is None


BASELINE = "results/ci-baseline"


@pytest.mark.parametrize(
    "command",
    [
        ["--help"],
        ["models"],  # the built-in presets; only --profile loads the plan
        ["report", "--help"],
        ["check", "--help"],
        ["check", "--baseline", BASELINE, "--current", BASELINE, "--deterministic"],
    ],
)
def test_read_only_commands_do_not_import_torch(command):
    code = (
        "import sys; from attnbench.cli import app\n"
        "try:\n"
        f"    app({command!r}, standalone_mode=False)\n"
        "except SystemExit as exit:\n"
        "    assert exit.code in (0, None), exit.code\n"
        "print(__import__('json').dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded == [], f"`attnbench {' '.join(command)}` imported torch"


@pytest.mark.slow
def test_a_report_imports_no_torch(tmp_path):
    """The report reads what it knows of each implementation (its family, label, baseline, memory
    order) from the registry's declarations: over rows of rings and their single-device
    counterparts it imports neither an implementation's code nor torch."""
    code = (
        "import sys; from attnbench.cli import app\n"
        f"app(['report', 'results/2026-11-22-h200x2-ring-max-seq', '--out', {str(tmp_path)!r}], standalone_mode=False)\n"
        "print(__import__('json').dumps(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [] and (tmp_path / "report.md").is_file()


# Calls that take a measurement's time or memory from the device: CUDA timing events and the
# allocator's peak counters.
MEASURING_CALLS = ("cuda.Event(", "max_memory_allocated(", "max_memory_reserved(", "reset_peak_memory_stats(")


def test_one_module_creates_timing_events_and_reads_allocator_peaks():
    """Trials alone, sequence-parallel ranks and speedup ranks measure through one core and one
    measure (``trials.placed_job``): no other module times with CUDA events, reads the
    allocator's peaks or calls the core's measured step."""
    core = "attnbench.measure.core"
    found = {m: [c for c in MEASURING_CALLS if c in path.read_text()] for m, path in modules().items() if m != core}
    assert {m: calls for m, calls in found.items() if calls} == {}
    assert all(c in modules()[core].read_text() for c in MEASURING_CALLS)
    measuring = {m for m in modules() for target, names, _ in imports(m) if target == core and "measure_step" in names}
    assert measuring == {"attnbench.trials.placed_job"}, "one measure for every trial, placed or alone"
