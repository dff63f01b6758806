"""`verify` and `inspect` refuse a folder that is not a finished dataset, and say why.

A run killed during `--overwrite` leaves the old dataset beside its in-progress marker: the
folder may hold a mix of two runs' files until a rerun replaces it, and a reader must wait
(docs/reliability.md, "Atomic output"). Before, verify said OK there; and it took any error
reading summary.json (a store that does not answer, a summary.json that is no file) for "no
summary.json (not a finished img2tfrecord dataset)".
"""

from __future__ import annotations

import os
import signal
import time

from beam_pipeline import main
from tests.faults import launch, two_classes
from transforms.output.publish import MARKER_FILE
from transforms.testhooks import PAUSE_ENV


def _error(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_folder_with_the_in_progress_marker_is_refused(tmp_path, capsys):
    tree = two_classes(tmp_path / "images", 4)
    out, flag = tmp_path / "out", tmp_path / "paused"
    args = ["--input", str(tree), "--output_dir", str(out), "--quiet"]
    assert main.main(args) == main.EXIT_OK
    assert main.main(["verify", str(out)]) == main.EXIT_OK
    capsys.readouterr()
    # An --overwrite run killed while it writes its shards: the old dataset, and the marker.
    run = launch([*args, "--overwrite"], {PAUSE_ENV: f"write_shard:{flag}"})
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert run.poll() is None and time.monotonic() < deadline, "never reached write_shard"
            time.sleep(0.05)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.communicate()
    assert (out / "summary.json").exists() and (out / MARKER_FILE).exists()
    for verb in ("verify", "inspect"):
        assert main.main([verb, str(out)]) == main.EXIT_USAGE
        line = _error(capsys)
        assert line == (
            f"img2tfrecord: error: {out}: not a finished img2tfrecord dataset: {MARKER_FILE} is there (a run "
            "is writing it, or was interrupted there: its files may be a mix of two runs); wait for the run "
            "to end, or rerun the conversion"
        ), line


def test_a_summary_that_cannot_be_read_is_named_not_taken_for_a_missing_one(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "summary.json").mkdir(parents=True)  # there, but no file: reading it fails
    assert main.main(["verify", str(out)]) == main.EXIT_USAGE
    line = _error(capsys)
    assert line.startswith(f"img2tfrecord: error: {out / 'summary.json'}: cannot read it: "), line
    assert "not a finished" not in line
    (out / "summary.json").rmdir()
    assert main.main(["verify", str(out)]) == main.EXIT_USAGE  # missing: that, and only that
    assert (
        _error(capsys) == f"img2tfrecord: error: {out}: no summary.json (not a finished img2tfrecord dataset)"
    )
