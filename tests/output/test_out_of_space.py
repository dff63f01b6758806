"""Out of space (bytes or inodes) mid-run is a user error: one line, exit 2, the folder as it was.

The output is on a small tmpfs (mounted here: the tests run as root in CI; elsewhere they are
skipped, saying why). Before: `OSError: [Errno 28]` escaped from WriteShardFn or Finalize,
exit 1 with 115-167 lines; the marker and staging folder stayed, hiding a finished dataset
that was being replaced behind the marker until a rerun succeeded.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from beam_pipeline import main
from beam_pipeline.cli.faults import RUNNING, RunEnd
from tests.faults import convert, one_line, two_classes
from transforms.output.claim import claim_output
from transforms.output.publish import MARKER_FILE


@pytest.fixture(scope="module")
def big_tree(tmp_path_factory) -> Path:
    """12 images of ~45 KB (random pixels: PNG cannot compress them), ~540 KB in all."""
    return two_classes(tmp_path_factory.mktemp("space") / "images", 12, (120, 120))


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory) -> Path:
    return two_classes(tmp_path_factory.mktemp("space-small") / "images", 4)


@contextlib.contextmanager
def _tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at `mnt` with `options` for the block (the test is skipped, saying why,
    where mount is not allowed)."""
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()}): run the tests as root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture
def small_disk(tmp_path):
    """A 600 KiB tmpfs: room for a small dataset, not for big_tree's."""
    with _tmpfs(tmp_path / "disk", "size=600k") as mnt:
        yield mnt


@pytest.fixture
def few_inodes(tmp_path):
    """A tmpfs with bytes to spare and 8 inodes: the claim fits, the shards of a run do not."""
    with _tmpfs(tmp_path / "inodes", "size=8m,nr_inodes=8") as mnt:
        yield mnt


def _args(tree: Path, out: Path, *extra: str) -> list[str]:
    return ["--input", str(tree), "--output_dir", str(out), *extra]


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def test_a_disk_that_fills_mid_run_is_one_line_and_leaves_the_folder_as_it_was(big_tree, small_disk):
    out = small_disk / "out"
    status, stderr, _ = convert(_args(big_tree, out))
    assert status == 2, stderr[-3000:]
    line = one_line(stderr)
    assert line.startswith("img2tfrecord: error: out of space: No space left on device"), line
    assert line.endswith(
        "; nothing was published and the output folder is as it was; free some space and rerun the same command"
    ), line
    assert os.listdir(out) == []  # no marker, no staging folder
    assert shutil.disk_usage(small_disk).used < 64 * 1024  # the partial shards are gone too


def test_a_dataset_replaced_on_a_full_disk_stays_finished(small_tree, big_tree, small_disk):
    out = small_disk / "out"
    status, stderr, _ = convert(_args(small_tree, out))
    assert status == 0, stderr[-3000:]
    before = _files(out)
    status, stderr, _ = convert(_args(big_tree, out, "--overwrite"))
    assert status == 2, stderr[-3000:]
    line = one_line(stderr)
    assert "out of space" in line and "the dataset already there is kept, finished" in line, line
    assert _files(out) == before and MARKER_FILE not in before  # untouched, and finished
    assert main.main(["verify", str(out)]) == main.EXIT_OK


def test_inodes_that_run_out_mid_run_are_one_line(small_tree, few_inodes):
    out = few_inodes / "out"
    status, stderr, _ = convert(_args(small_tree, out, "--num_shards", "4"))
    assert status == 2, stderr[-3000:]
    line = one_line(stderr)
    assert line.startswith("img2tfrecord: error: out of space: No space left on device"), line
    assert os.listdir(out) == []


def test_a_publish_that_had_begun_leaves_the_folder_unfinished_and_says_so(tmp_path):
    """A disk that fills once publishing has begun (its first step removes the old
    summary.json): the marker stays, its lease ended, and the line says the folder is
    unfinished; the next run takes it over without --overwrite."""
    out = tmp_path / "out"
    out.mkdir()
    for name, text in (("summary.json", "{}"), ("train-00000-of-00001.tfrecord", "old")):
        (out / name).write_text(text)
    end = RunEnd(str(out), None, local=True)
    end.claim = claim_output(str(out), True, "replacing")
    end.stage = RUNNING
    (out / "summary.json").unlink()  # what publishing does first
    line = end.stop(OSError(errno.ENOSPC, "No space left on device"))
    assert line.startswith("out of space: No space left on device") and len(line) <= 300 - len(
        "img2tfrecord: error: "
    )
    assert line.endswith(
        f"; publishing had begun, so {out} is unfinished (its marker stays) until a rerun replaces it; free "
        "some space and rerun the same command"
    ), line
    assert json.loads((out / MARKER_FILE).read_text())["run_id"] == "replacing"
    taken = claim_output(str(out), False, "next")  # no --overwrite needed: a dead run's leftovers
    try:
        assert taken.resumed == "replacing"
    finally:
        taken.release()
