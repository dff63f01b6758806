"""Beam's unpublished names are used in one module only, transforms/beam_internals.py.

A name is unpublished when it starts with `_`, or comes from a Beam module outside its
documented API (the runner and worker internals, coder implementations, internal helpers).
"""

from __future__ import annotations

import ast
from pathlib import Path

import apache_beam as beam

from transforms import beam_internals

REPO = Path(__file__).resolve().parents[2]
ADAPTER = REPO / "transforms" / "beam_internals.py"
INTERNAL_MODULES = (
    "apache_beam.runners.worker",
    "apache_beam.runners.portability",
    "apache_beam.runners.common",
    "apache_beam.internal",
    "apache_beam.utils",
    "apache_beam.coders.coder_impl",
)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _internal(module: str) -> bool:
    return module.startswith(INTERNAL_MODULES) or any(_private(part) for part in module.split("."))


def _uses(path: Path) -> list[str]:
    """Beam's unpublished names that `path` imports or reads off a name it got from Beam."""
    tree = ast.parse(path.read_text())
    from_beam: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("apache_beam"):
                    from_beam.add((a.asname or a.name).split(".")[0])
                    if _internal(a.name):
                        found.append(a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("apache_beam"):
            for a in node.names:
                from_beam.add(a.asname or a.name)
                if _internal(f"{node.module}.{a.name}") or _private(a.name):
                    found.append(f"{node.module}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, (ast.Attribute, ast.Call, ast.Subscript)):
                root = root.func if isinstance(root, ast.Call) else root.value
            if isinstance(root, ast.Name) and root.id in from_beam:
                found.append(node.attr)
    return found


def test_beams_unpublished_names_are_used_in_the_adapter_only():
    product = sorted(p for d in ("beam_pipeline", "transforms") for p in (REPO / d).rglob("*.py"))
    outside = [
        f"{path.relative_to(REPO)}: {name}" for path in product if path != ADAPTER for name in _uses(path)
    ]
    assert outside == []
    assert _uses(ADAPTER)  # the scan finds what the adapter does use


def test_the_adapter_was_checked_against_this_beam():
    # Unpublished names change without notice: read each again in the new Beam (and the
    # reason the adapter's docstring gives for it), then update BEAM_CHECKED.
    assert beam.__version__ == beam_internals.BEAM_CHECKED, (
        f"Beam {beam.__version__}: check transforms/beam_internals.py against it "
        f"(checked with {beam_internals.BEAM_CHECKED})"
    )
