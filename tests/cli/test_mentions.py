"""Every file and Python name the docs mention exists: README.md, docs/*.md, the Makefile, and
the docstrings and comments of beam_pipeline/ and transforms/.

Code moves (transforms/writing/ -> transforms/output/, schema into encoding/, tests into
tests/<stage>/); a mention left behind sends a reader, or a pasted snippet, nowhere. Mentions
are recognised by their form:

- a path whose first part is a top-level entry of the repository (`tests/images/...`,
  `transforms/output/claim.py`, `benchmarks/run.py`) must exist;
- a file or folder path starting at a package of transforms/ or beam_pipeline/
  (`output/claim.py`, `cli/`) must exist under one of them;
- a bare Python file name (`lease.py`) must be some file of the repository;
- a dotted name under our packages (`transforms.encoding.schema.schema_from_summary`) must
  import, attribute by attribute.

Paths of other projects (`object_detection/...`) and of the output (`out/labels.txt`) have
none of these forms and are left alone.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import subprocess
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("beam_pipeline", "transforms")

_PATH = re.compile(r"(?<![\w./:~$-])((?:[\w.-]+/)+[\w.-]*|[\w-]+\.py)(?![\w/-])")
_DOTTED = re.compile(r"(?<![\w./-])((?:transforms|beam_pipeline|tests|benchmarks)(?:\.\w+)+)")


def _tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if (REPO / p).exists()]


def _code_texts(path: Path) -> str:
    """The docstrings and comments of one Python file."""
    source = path.read_text()
    parts = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            parts.append(ast.get_docstring(node, clean=False) or "")
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            parts.append(token.string)
    return "\n".join(parts)


def _texts() -> dict[str, str]:
    texts = {p: (REPO / p).read_text() for p in ["README.md", "Makefile"]}
    texts |= {f"docs/{p.name}": p.read_text() for p in sorted((REPO / "docs").glob("*.md"))}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            texts[str(path.relative_to(REPO))] = _code_texts(path)
    return texts


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            if not hasattr(obj, attribute):
                return False
            obj = getattr(obj, attribute)
        return True
    return False


def stale_mentions(texts: dict[str, str]) -> list[str]:
    """`where: mention` for each mention in `texts` (where -> text) that resolves to nothing."""
    tracked = _tracked()
    top = {p.split("/")[0] for p in tracked}
    file_names = {p.rsplit("/", 1)[-1] for p in tracked}
    subpackages = {p.split("/")[1] for p in tracked if p.split("/")[0] in PACKAGES and p.count("/") >= 2}
    stale = []
    for where, text in texts.items():
        for match in _PATH.finditer(text):
            mention = match[1].rstrip(".")
            first = mention.split("/")[0]
            if first in top:
                found = (REPO / mention).exists()
            elif first in subpackages and mention.endswith((".py", "/")):
                found = any((REPO / package / mention).exists() for package in PACKAGES)
            elif "/" not in mention:
                found = mention in file_names
            else:
                continue  # another project's path, one of the output, or words ("images/s")
            if not found:
                stale.append(f"{where}: {mention}")
        stale += [f"{where}: {m[1]}" for m in _DOTTED.finditer(text) if not _resolves(m[1].rstrip("."))]
    return sorted(set(stale))


def test_every_file_and_module_the_docs_and_docstrings_mention_exists():
    assert stale_mentions(_texts()) == []


def test_the_check_sees_a_moved_file_and_a_moved_module():
    """Those of this morning, as they were written before the moves."""
    texts = {
        "docs/images.md": "`transforms.schema.schema_from_summary(...)`, see `tests/test_jpeg_check.py`",
        "transforms/output/claim.py": "the marker (transforms/writing/publish.py, `writing/claim.py`)",
        "docs/internals.md": "`shard_writer.py`, `output/claim.py`, `out/labels.txt`, `object_detection/x.py`",
    }
    assert stale_mentions(texts) == [
        "docs/images.md: tests/test_jpeg_check.py",
        "docs/images.md: transforms.schema.schema_from_summary",
        "docs/internals.md: shard_writer.py",
        "transforms/output/claim.py: transforms/writing/publish.py",
        "transforms/output/claim.py: writing/claim.py",
    ]
