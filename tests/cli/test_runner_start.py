"""A runner that cannot start the job: one line (exit 2), nothing left, and the next run goes at once.

Flink and Spark without a cluster download a job server jar, Prism a binary: here the
internet is cut by an HTTP(S) proxy nobody listens on (urllib honours it), so each download
is refused at once instead of waiting on the network. A Prism binary that exits at once, and
Beam's DaskRunner (without dask: an ImportError; with it: no translation for Impulse) fail
without a network. Before, each was a ~200-line traceback, exit 1, and a `"job": true` marker
that refused the next run into the folder, even with the local runner, for two minutes.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults import convert, one_line, two_classes
from tests.gcs_emulator import free_port

DASK = "apache_beam.runners.dask.dask_runner.DaskRunner"


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    return two_classes(tmp_path_factory.mktemp("runners") / "images", 4)


@pytest.fixture(scope="module")
def no_internet() -> dict[str, str]:
    proxy = f"http://127.0.0.1:{free_port()}"
    return {"https_proxy": proxy, "http_proxy": proxy, "no_proxy": "localhost,127.0.0.1"}


def _broken_prism(tmp_path: Path) -> list[str]:
    binary = tmp_path / "prism"
    binary.write_text('#!/bin/sh\necho "prism: cannot start here" >&2\nexit 1\n')
    binary.chmod(0o755)
    return ["--runner", "PrismRunner", f"--prism_location={binary}"]


@pytest.mark.parametrize(
    "runner",
    [
        ["--runner", "FlinkRunner"],
        ["--runner", "SparkRunner"],
        ["--runner", "PrismRunner"],
        "broken prism",
        ["--runner", DASK],
    ],
    ids=["flink", "spark", "prism", "broken-prism", "dask"],
)
def test_a_runner_that_cannot_start_is_one_line_and_frees_the_folder(tree, tmp_path, no_internet, runner):
    out = tmp_path / "out"
    flags = _broken_prism(tmp_path) if runner == "broken prism" else runner
    status, stderr, seconds = convert(
        ["--input", str(tree), "--output_dir", str(out), *flags], no_internet, 120
    )
    assert status == 2, stderr[-3000:]
    line = one_line(stderr)
    assert line.startswith(f"img2tfrecord: error: --runner {flags[1]} could not start the job ("), line
    assert "nothing was written; rerun without --runner" in line, line
    assert seconds < 60
    assert os.listdir(out) == []  # no marker, no staging folder
    # The next run, with the local runner, proceeds at once (no "being written by the job").
    status, stderr, _ = convert(["--input", str(tree), "--output_dir", str(out)], limit=180)
    assert status == 0, stderr[-3000:]
    assert (out / "summary.json").exists()
