"""PortableRunner jobs that die or never start, seen from the launcher (Beam's Python job server
and worker pool, as tests/cloud/test_cloud_portable.py runs them).

- The worker pool killed mid-run: the job fails; the launcher says so in one line (exit 2),
  releases the folder, and the next run with the local runner proceeds at once. (Before: a
  180-line traceback, exit 1, and a marker that refused every rerun for two minutes.)
- `--environment_type LOOPBACK`: the workers live in the launcher, so a killed launcher kills
  the job; its claim is the local, lock-based one, taken over at once. (Before: the marker said
  `"job": true` and a rerun waited two minutes for a job that no longer existed.)
- A worker pool whose workers cannot import Beam: the job waits for them for ever; the
  launcher says on stderr that it shows no progress (IMG2TFRECORD_STALL_SECONDS, seconds
  here; minutes by default). (Before: silence.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time

from tests.cloud.test_cloud_portable import (  # noqa: F401 - tree, reference: fixtures
    _args,
    _files,
    _wait_for,
    portable_runner,
    reference,
    tree,
)
from tests.faults import convert, launch, one_line
from transforms.output.publish import MARKER_FILE
from transforms.testhooks import PAUSE_ENV

STALL_ENV = "IMG2TFRECORD_STALL_SECONDS"


def test_a_killed_worker_pool_ends_the_run_in_one_line_and_frees_the_folder(tree, reference, tmp_path):  # noqa: F811
    out, flag, started = tmp_path / "out", tmp_path / "paused", []
    with portable_runner({PAUSE_ENV: f"write_shard:{flag}"}, tmp_path, started) as runner:
        launcher = launch([*_args(tree, out), *runner], {})
        try:
            _wait_for(flag.exists, "reached write_shard", launcher)
            pool = started[1]
            os.killpg(pool.pid, signal.SIGKILL)
            killed = time.monotonic()
            _, stderr = launcher.communicate(timeout=120)
        finally:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.communicate()
    assert launcher.returncode == 2, stderr[-3000:]
    line = one_line(stderr)
    assert line.startswith("img2tfrecord: error: the PortableRunner job failed ("), line
    assert "nothing was published and the output folder is as it was; rerun the same command" in line
    assert time.monotonic() - killed < 60
    assert os.listdir(out) == []  # the job provably died: its claim and staging folder are gone
    status, stderr, _ = convert(_args(tree, out))  # the default command, at once
    assert status == 0, stderr[-3000:]
    assert _files(out) == reference


def test_a_killed_loopback_launcher_leaves_a_folder_the_next_run_takes_at_once(tree, reference, tmp_path):  # noqa: F811
    out, flag = tmp_path / "out", tmp_path / "paused"
    with portable_runner({}, tmp_path) as runner:
        loopback = [*runner[:3], "--environment_type=LOOPBACK"]  # the job server; workers in the launcher
        launcher = launch([*_args(tree, out), *loopback], {PAUSE_ENV: f"write_shard:{flag}"})
        try:
            _wait_for(flag.exists, "reached write_shard", launcher)
            marker = json.loads((out / MARKER_FILE).read_text())
            assert "job" not in marker, marker  # the job dies with the launcher: the lock is the claim
        finally:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
        status, stderr, seconds = convert(_args(tree, out))
    assert status == 0, stderr[-3000:]
    assert "replacing the unfinished output of an earlier run" in stderr
    assert _files(out) == reference


def test_workers_that_cannot_import_beam_are_reported_not_waited_on_silently(tree, tmp_path):  # noqa: F811
    """The pool starts each worker as `python -c 'from apache_beam...'`; its `python` here is
    one without site-packages, so the import fails and the job never gets a worker."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python").write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    (shim / "python").chmod(0o755)
    out = tmp_path / "out"
    with portable_runner({"PATH": f"{shim}{os.pathsep}{os.environ['PATH']}"}, tmp_path) as runner:
        launcher = launch([*_args(tree, out), *runner], {STALL_ENV: "3"})
        lines: list[str] = []
        try:
            start = time.monotonic()
            while len(lines) < 2 and time.monotonic() - start < 60:  # a line at 3 s, then at 6 s
                lines.append(launcher.stderr.readline())
                assert lines[-1], f"the launcher ended: {''.join(lines)}"
            seconds = time.monotonic() - start
        finally:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.communicate()
    assert seconds < 30, lines
    waited = []
    for line in lines:
        found = re.match(r"img2tfrecord: the job has shown no progress for (\d+)s \(state RUNNING, ", line)
        assert found and len(line) <= 300, line
        assert "If its workers cannot start it never ends: see the job server's and the workers' logs" in line
        waited.append(int(found[1]))
    assert 3 <= waited[0] < 6 <= waited[1] < 12, waited  # after 3 s, then after twice as long
    assert "No module named 'apache_beam'" in (tmp_path / "worker_pool_main.log").read_text()
