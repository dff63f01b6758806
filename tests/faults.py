"""What every fault test checks of a run that failed: the CLI's one line, and its time.

Docs: docs/reliability.md ("When something fails"); the run's end: beam_pipeline/cli/faults.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

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
