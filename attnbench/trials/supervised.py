"""Outside code, seen from attnbench's own process: never imported here.

An implementation named by import path or entry point is a user's code: it may hang, end its
process, print, or start processes of its own. The command line installs ``find_spec`` as the
registry's resolver of outside names (``run_outside_in_workers``): a worker process, supervised
like a trial, imports the module, reads its factory's parameters and builds it for each
configuration asked, under a time limit from the import on; this process keeps only what the
worker read (``impls.outside.DescribedImpl``). The trials, the reference check and the contract
check run the code itself, each in a worker of its own (``trial``). A worker that dies (the
limit, an exit, a crash) is one line naming what the code did; whatever it printed is its
output, kept apart from the protocol (``runtime.supervise``), and every process it started ends
with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from attnbench import impls
from attnbench.errors import AttnbenchError, ConfigError
from attnbench.impls.entry import Described, SpecFields
from attnbench.measure.timing import COLD_CALL_FACTOR
from attnbench.runtime.jobs import Ended, job
from attnbench.runtime.supervise import announce_phase
from attnbench.runtime.worker import run_in_child
from attnbench.units import clip_text

if TYPE_CHECKING:  # the implementations (and torch) are imported where a name is resolved, not here
    from attnbench.impls.entry import ImplSpec
    from attnbench.impls.outside import DescribedImpl

# The per-call limit outside code is held to while it is imported and built, unless the
# command names one (--max-trial-seconds): the default of a trial's. Importing and building
# get COLD_CALL_FACTOR times it, as a cold first call does.
DEFAULT_CALL_LIMIT_S = 60.0
_call_limit_s = DEFAULT_CALL_LIMIT_S
# (name, configuration as JSON) -> what a worker read of that build, or why it failed
_builds: dict[tuple[str, str], Build] = {}


def run_outside_in_workers(call_limit_s: float | None = None) -> None:
    """From now on, outside names resolve without importing their code here; ``call_limit_s``
    (a command's --max-trial-seconds) bounds their import and build in the worker."""
    global _call_limit_s
    _call_limit_s = call_limit_s or DEFAULT_CALL_LIMIT_S
    _builds.clear()
    impls.resolve_outside_with(find_spec, _built)


def import_limit_s() -> float:
    """Seconds outside code may take from its import to its built module: a cold call's."""
    return COLD_CALL_FACTOR * _call_limit_s


def find_spec(name: str) -> ImplSpec | None:
    """The spec of an import path or installed entry point, read by a worker process (with
    the build at its defaults, the configuration most runs use); None for any other name."""
    from attnbench.impls import entry, outside

    if not entry.is_import_path(name) and name not in entry.entry_points():
        return None
    fields = _describe(name, None)

    def factory(**config: Any) -> DescribedImpl:
        return _built(name, config)

    return outside.described_spec(name, fields, factory)


def _built(name: str, config: dict[str, Any]) -> DescribedImpl:
    from attnbench.impls.outside import DescribedImpl

    key = (name, _key(config))
    if key not in _builds:
        _describe(name, [config])
    build = _builds[key]
    if build.error is not None:
        raise ConfigError(build.error)
    return DescribedImpl(build.impl)


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def _describe(name: str, configs: list[dict[str, Any]] | None) -> SpecFields:
    """Run ``describe_job`` in a worker (``name``: an outside implementation, or a built-in
    whose configurations name outside code); keep its builds; the spec's fields."""
    limit = import_limit_s()
    ran = run_in_child(describe_job, DescribeSpec(name, limit, configs), limit)
    found = ran.result
    if found is None or found.spec is None:
        raise ConfigError(found.error if found is not None else _worker_ended(name, ran.ended, limit))
    for build in found.builds:
        _builds[(name, _key(build.config))] = build
    return found.spec


def _worker_ended(name: str, ended: Ended, limit_s: float) -> str:
    """Why the worker that imports and builds ``name`` left no description, in one line."""
    if ended.status == "time-limit":
        return (
            f"{name} was still being imported or built after {limit_s:g} s ({COLD_CALL_FACTOR:g} x the "
            "per-call limit, --max-trial-seconds): it was stopped; fix what its import or factory waits for"
        )
    return (
        f"{name} ended the worker process that imports and builds it "
        f"({ended.status}: {clip_text(str(ended.message), 240)}); "
        "an implementation must return its module, not exit"
    )


@dataclass
class DescribeSpec:
    name: str  # an outside implementation, or a built-in whose configurations name outside code
    limit_s: float  # its import and builds
    configs: list[dict[str, Any]] | None = None  # None: its defaults


@dataclass
class Build:
    """One configuration built in the worker: what the parent keeps of it, or why it failed."""

    config: dict[str, Any]
    impl: Described | None = None
    error: str | None = None


@dataclass
class Description:
    spec: SpecFields | None = None  # None where the name is not one
    builds: list[Build] = field(default_factory=list)
    error: str | None = None  # why there is no spec


@job
def describe_job(args: DescribeSpec) -> Description:
    """Worker side: import ``name`` (under the time limit from here on), read its spec and
    build it for each configuration (None: at its defaults). A ConfigError is the answer, not
    a failure of the worker."""
    from attnbench.impls import outside

    announce_phase("outside", args.limit_s)
    try:
        spec = impls.spec(args.name)
        configs = args.configs
        if configs is None:
            configs = [{p.name: p.default for p in spec.params}]
    except AttnbenchError as exc:
        return Description(error=str(exc))
    builds = []
    for config in configs:
        try:
            builds.append(Build(config, impl=outside.described(impls.build(args.name, **config))))
        except AttnbenchError as exc:
            builds.append(Build(config, error=str(exc)))
    return Description(outside.spec_fields(spec), builds)
