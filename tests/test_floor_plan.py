"""The floor plan: every module sits in the package of its stage, imports run with the data flow.

The stages, in the order the data flows (README's diagram, beam_pipeline/pipeline.py):

    shared records -> listing -> labels -> images -> layout -> encoding -> writing -> output -> verify
    -> beam_pipeline.settings (the stages' settings) -> beam_pipeline.cli (options, checks) -> beam_pipeline.pipeline (the graph) and
    beam_pipeline.readers (load_dataset, verify, inspect) -> beam_pipeline (the verbs)

A module may import its own package, the shared modules and earlier stages; never a later stage
and never the CLI. `images` (read, check, convert one image) comes before `layout` because the
planning pre-scan (layout/prescan.py) reads image headers to estimate stored sizes.

Pure modules do not import Apache Beam's pipeline API: inside a stage package, the Beam shells
are the modules named `beam.py` or `beam_<what>.py`; every other module may use only Beam's filesystem layer
(`apache_beam.io.filesystem(s)`, `apache_beam.io.gcp`), which is how gs:// paths are read and written.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Stage order: a module of rank r may import modules of rank <= r (its own rank: same package).
STAGES = (
    (
        "transforms.records",
        "transforms.objects",
        "transforms.coders",
        "transforms.failures",
        "transforms.paths",
        "transforms.batching",
        "transforms.progress",
        "transforms.testhooks",
        "transforms.beam_internals",
        "transforms.retry",
        "transforms.gcs",
    ),
    ("transforms.listing",),
    ("transforms.labels",),
    ("transforms.images",),
    ("transforms.layout",),
    ("transforms.encoding",),
    ("transforms.writing",),
    ("transforms.output",),
    ("transforms.verify",),
    ("beam_pipeline.settings",),
    ("beam_pipeline.cli",),
    ("beam_pipeline.pipeline", "beam_pipeline.readers"),
    ("beam_pipeline",),
)
SHARED = STAGES[0]
# Shared modules that are Beam helpers by design (batching and progress counters are DoFns and
# combiners every stage uses); every other shared module is pure.
SHARED_BEAM = ("transforms.batching", "transforms.progress", "transforms.coders", "transforms.beam_internals")
FILESYSTEM_ONLY = ("apache_beam.io.filesystem", "apache_beam.io.filesystems", "apache_beam.io.gcp")
# Shared modules that reach stores through Beam's filesystem layer only (gs:// for every stage).
SHARED_FILESYSTEM = ("transforms.gcs",)
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    found = {}
    for top in ("transforms", "beam_pipeline"):
        for path in sorted((REPO / top).rglob("*.py")):
            dotted = ".".join(path.relative_to(REPO).with_suffix("").parts)
            found[dotted.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _stage(module: str) -> int:
    if module in ("transforms", "beam_pipeline"):
        return 0 if module == "transforms" else len(STAGES) - 1
    best, rank = -1, None
    for r, prefixes in enumerate(STAGES):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, rank = len(prefix), r
    if rank is None:
        raise AssertionError(f"{module} belongs to no stage: put it in a stage package")
    return rank


def _imports(path: Path) -> list[tuple[str, int]]:
    """(imported module, line) for every import of ours or of apache_beam, resolving `from pkg import mod`."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.append((sub if sub in MODULES else node.module, node.lineno))
    return out


def _ours(name: str) -> bool:
    return name.split(".")[0] in ("transforms", "beam_pipeline")


def test_every_module_sits_in_a_stage_package():
    loose = [
        m
        for m, path in MODULES.items()
        if m.count(".") == 1
        and m.startswith("transforms.")
        and m not in SHARED
        and path.name != "__init__.py"
    ]
    assert loose == [], f"modules outside a stage package: {loose}"
    for m in MODULES:
        _stage(m)


def test_imports_follow_the_data_flow():
    against = []
    for module, path in MODULES.items():
        rank = _stage(module)
        for name, line in _imports(path):
            if _ours(name) and _stage(name) > rank:
                against.append(f"{path.relative_to(REPO)}:{line} imports {name} (a later stage)")
    assert against == [], "\n".join(against)


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def test_no_module_imports_the_cli_or_another_packages_privates():
    """Modules of one package may share private names; across packages only public ones."""
    cli = ("beam_pipeline.main", "beam_pipeline.flex", "beam_pipeline.__main__")
    bad = []
    for module, path in MODULES.items():
        if module not in cli:
            bad += [f"{module} imports {n}" for n, _ in _imports(path) if n in cli]
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module in MODULES):
                continue
            if _package(node.module) != _package(module):
                bad += [
                    f"{module} imports the private {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_")
                ]
    assert bad == [], "\n".join(bad)


def test_no_import_cycles():
    graph = {m: {n for n, _ in _imports(p) if n in MODULES and n != m} for m, p in MODULES.items()}
    # Package __init__ modules only carry docstrings and re-exports; an edge into one is an edge
    # into what it re-exports, which the walk already follows.
    seen, stack, cycles = set(), [], []

    def visit(m: str) -> None:
        if m in stack:
            cycles.append(" -> ".join(stack[stack.index(m) :] + [m]))
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for n in sorted(graph[m]):
            visit(n)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    assert cycles == [], "\n".join(cycles)


def _beam_imports(path: Path) -> list[str]:
    return [n for n, _ in _imports(path) if n.split(".")[0] == "apache_beam"]


@pytest.mark.parametrize(
    "package",
    [
        "transforms.listing",
        "transforms.labels",
        "transforms.images",
        "transforms.layout",
        "transforms.encoding",
        "transforms.writing",
        "transforms.verify",
    ],
)
def test_pure_modules_are_apart_from_the_beam_shells(package):
    impure = []
    for module, path in MODULES.items():
        if not module.startswith(package + "."):
            continue
        name = module.rsplit(".", 1)[1]
        if name == "beam" or name.startswith("beam_"):
            continue
        used = [n for n in _beam_imports(path) if not n.startswith(FILESYSTEM_ONLY)]
        if used:
            impure.append(f"{module}: {used}")
    assert impure == [], "Beam pipeline code belongs in the package's beam.py / beam_*.py: " + "; ".join(
        impure
    )


def test_shared_records_are_pure():
    for module in SHARED:
        if module in SHARED_BEAM:
            continue
        allowed = FILESYSTEM_ONLY if module in SHARED_FILESYSTEM else ()
        assert [n for n in _beam_imports(MODULES[module]) if not n.startswith(allowed or ("-",))] == [], (
            module
        )


def test_each_package_says_what_flows_in_and_out():
    for module, path in MODULES.items():
        if path.name == "__init__.py" and module != "transforms" and module != "beam_pipeline":
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert len(doc) > 80, f"{module}: the package docstring should say what flows in and out"


def test_modules_stay_readable_in_size():
    long = []
    for module, path in MODULES.items():
        lines = path.read_text().count("\n")
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > MAX_LINES and "lines" not in doc:
            long.append(f"{module}: {lines} lines")
    assert long == [], f"over {MAX_LINES} lines without a reason in the module docstring: {long}"


def test_tests_follow_the_layout():
    whole_job = {"test_end_to_end.py", "test_benchmark_smoke.py", os.path.basename(__file__)}
    stray = [p.name for p in (REPO / "tests").glob("test_*.py") if p.name not in whole_job]
    assert stray == [], "tests live in the folder of their stage (tests/<stage>/)"
