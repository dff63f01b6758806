"""The run's end (beam_pipeline/cli/faults.py): which errors are the user's to act on (one line,
exit 2) and which are bugs of ours (a traceback, exit 1), and what the line keeps when it is
cut to 300 characters. The faults themselves are reproduced end to end in tests/cloud
(test_store_faults.py, test_portable_faults.py), tests/cli/test_runner_start.py and
tests/output/test_out_of_space.py.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import time

import pytest

from beam_pipeline import main
from beam_pipeline.cli.faults import SPACE, STORE, USER, cause_line, fault_of, has_our_frames, shorten
from beam_pipeline.cli.options import UserError
from beam_pipeline.cli.progress import JobWatch
from tests.conftest import write_image
from transforms.failures import USER_ERROR_MARKER
from transforms.output.publish import MARKER_FILE, TEMP_PREFIX
from transforms.retry import GaveUp


def _wrapped(error: BaseException) -> RuntimeError:
    """`error` as a runner re-raises it from a worker: only its text survives."""
    return RuntimeError(
        f"Pipeline failed: Traceback ...\n{type(error).__name__}: {error} [while running 'Step']"
    )


@pytest.mark.parametrize(
    "error, kind, cause",
    [
        (OSError(errno.ENOSPC, "No space left on device"), SPACE, "out of space: No space left on device ("),
        (
            _wrapped(OSError(errno.EDQUOT, "Disk quota exceeded")),
            SPACE,
            "out of space: Disk quota exceeded (",
        ),
        (
            GaveUp("Connection refused (still failing after 5 attempts in 60 s)", "gs://b"),
            STORE,
            "gs://b did not",
        ),
        (_wrapped(GaveUp("[Errno 111] Connection refused")), STORE, "a store did not answer: [Errno 111]"),
        (
            _wrapped(
                ValueError(f"{USER_ERROR_MARKER} gs://b answered nothing but errors for 60 s (last: x); ...")
            ),
            STORE,
            "gs://b answered nothing but errors for 60 s",
        ),
        (
            _wrapped(ValueError(f"{USER_ERROR_MARKER} the input holds no image files")),
            USER,
            "the input holds no",
        ),
    ],
)
def test_faults_the_user_can_act_on_are_found_in_the_error_or_its_text(error, kind, cause):
    fault = fault_of(error)
    assert fault is not None and fault.kind == kind and fault.cause.startswith(cause), fault
    assert fault.store == ("gs://b" if "gs://b" in cause else None)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad"),
        TypeError("'NoneType' object is not subscriptable"),
        OSError(errno.ENOENT, "missing"),
    ],
)
def test_anything_else_is_not_a_fault(error):
    assert fault_of(error) is None and fault_of(_wrapped(error)) is None


def test_frames_of_ours_tell_a_bug_from_a_runner_failing():
    beam = 'File "/venv/site-packages/apache_beam/transforms/core.py", line 1, in process'
    ours = 'File "/usr/local/lib/python3.11/site-packages/transforms/writing/beam.py", line 9, in process'
    assert not has_our_frames(f"Traceback (most recent call last):\n  {beam}\nRuntimeError: Channel closed")
    assert has_our_frames(f"Traceback (most recent call last):\n  {beam}\n  {ours}\nTypeError: x")


def test_the_cause_is_the_innermost_exception_line_without_its_noise():
    text = (
        "Pipeline job-1 failed in state FAILED: Error running pipeline.\nTraceback (most recent call last):\n"
        '  File "a.py", line 1\n_queue.Empty\n\nRuntimeError: Channel closed prematurely.'
    )
    assert cause_line(RuntimeError(text)) == "Channel closed prematurely"
    jar = RuntimeError(
        "Unable to fetch remote job server jar at https://repo.maven.apache.org/maven2/org/apache/beam/x/2.77.0/"
        "x-2.77.0.jar: <urlopen error [Errno 111] Connection refused>. Also failed to fetch from a mirror."
    )
    assert (
        cause_line(jar)
        == "Unable to fetch remote job server jar at …/x-2.77.0.jar: <urlopen error [Errno 111] Connection refused>"
    )
    assert (
        cause_line(ModuleNotFoundError("No module named 'dask'"))
        == "ModuleNotFoundError: No module named 'dask'"
    )


def test_a_line_cut_to_fit_keeps_what_to_do():
    path = (
        "gs://bucket/out/beam-temp-img2tfrecord-" + "0" * 32 + "/train/00000-" + "1" * 32 + ".train.tfrecord"
    )
    text = f"cannot write {path}: HTTP 503 Service Unavailable; nothing was published, rerun when the bucket is writable"
    short = shorten(text, 150)
    assert len(short) <= 150 and short.endswith("; nothing was published, rerun when the bucket is writable")
    assert short.startswith("cannot write gs://bucket/out/beam-temp-img2t") and "…" in short
    assert shorten("x" * 400, 100) == "x" * 99 + "…"


def test_a_bug_of_ours_is_still_a_traceback_and_its_folder_is_taken_over_at_once(tmp_path):
    """An error with no cause the user can act on propagates as it is (the CLI's traceback,
    exit 1); the run's leftovers stay, as a killed run's, and the next run replaces them."""
    tree = tmp_path / "images"
    for i in range(2):
        write_image(tree / "cat" / f"{i}.png", (8, 8), seed=i)
    out = tmp_path / "out"
    args = ["--input", str(tree), "--output_dir", str(out), "--write_processes", "1", "--quiet"]

    def reader_with_a_bug(path: str) -> bytes:
        raise TypeError("a bug of ours")

    with pytest.raises(Exception, match="a bug of ours") as raised:
        main.run(args, save_main_session=False, graph_seams={"reader": reader_with_a_bug})
    assert not isinstance(raised.value, UserError)
    left = os.listdir(out)
    assert MARKER_FILE in left and any(n.startswith(TEMP_PREFIX) for n in left)
    run_id = json.loads((out / MARKER_FILE).read_text())["run_id"]
    summary = main.run(args, save_main_session=False)  # no --overwrite, no wait
    assert summary["written"] == 2 and run_id not in "".join(os.listdir(out))


def test_the_job_watch_says_nothing_while_files_are_staged_and_speaks_once_they_stop(tmp_path):
    """JobWatch (cli/progress.py) against a staging folder that grows, then does not."""
    staging, stream = tmp_path / "staging", io.StringIO()

    class Running:  # a runner's result whose state never changes
        state = "RUNNING"

    with JobWatch(Running(), str(staging), stream, seconds=0.8):
        for i in range(8):  # a shard staged every 0.25 s for 2 s: progress
            (staging / "train").mkdir(parents=True, exist_ok=True)
            (staging / "train" / f"{i}.tfrecord").write_bytes(b"x" * (i + 1))
            time.sleep(0.25)
        assert stream.getvalue() == ""
        deadline = time.monotonic() + 10
        while not stream.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    line = stream.getvalue().splitlines()[0]
    assert re.match(
        r"img2tfrecord: the job has shown no progress for \d+s \(state RUNNING, no new file", line
    )
