"""What the fault tests share: a small labelled tree, the CLI in a subprocess, its one line.

Docs: docs/reliability.md ("When something fails"); the run's end: beam_pipeline/cli/faults.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import write_image

ROOT = Path(__file__).resolve().parents[1]
MAX_LINE = 300


def one_line(stderr: str) -> str:
    """The run's one error line: the only line on stderr, at most MAX_LINE characters, no traceback."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr, stderr[-3000:]
    assert len(lines) == 1, lines[:20]
    assert lines[0].startswith("img2tfrecord: error: "), lines[0]
    assert len(lines[0]) <= MAX_LINE, (len(lines[0]), lines[0])
    return lines[0]


def convert(args: list[str], env: dict[str, str] | None = None, limit: float = 180) -> tuple[int, str, float]:
    """The CLI in a subprocess: (exit status, stderr, seconds taken)."""
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "convert", *args, "--quiet"],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=limit,
    )
    return proc.returncode, proc.stderr, time.monotonic() - start


def launch(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """The CLI started in its own process group (to be killed whole), stderr as text on a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", "convert", *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def two_classes(root: Path, count: int, size: tuple[int, int] = (10, 12)) -> Path:
    """`count` random PNGs of `size` in root/cat and root/dog, alternately."""
    for i in range(count):
        write_image(root / ("cat", "dog")[i % 2] / f"{i}.png", size, seed=i)
    return root
