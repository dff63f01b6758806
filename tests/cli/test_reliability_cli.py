"""Bad command lines and occupied outputs: one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import write_image
from transforms.failures import user_error_text
from transforms.output.publish import MARKER_FILE


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--max_failure_ratio", "1.5"], "--max_failure_ratio must be between 0 and 1"),
        (["--max_failure_ratio", "-0.1"], "--max_failure_ratio must be between 0 and 1"),
        (["--max_failure_ratio", "nan"], "--max_failure_ratio must be between 0 and 1"),
        (["--max_failure_ratio", "lots"], "invalid float value"),
        (["--seed", "abc"], "invalid int value"),
        (["--shard_size_mb", "0"], "--shard_size_mb must be positive"),
        (["--num_shards", "-2"], "--num_shards must be 0"),
        (["--max_pixels", "0"], "--max_pixels must be positive"),
        (["--compression", "zip"], "invalid choice"),
        (["--splits", "../up=0.5,train=0.5"], "cannot be part of a file name"),
        (["--splits", "train=0.5,"], "expected name=ratio"),
        (["--input", ""], "--input is required"),
        (["--input", "{tmp}/imgs/c/x.png"], "not a folder"),
        (["--output_dir", "{tmp}/imgs/c/x.png"], "x.png is a file, not a folder; pass the path of a folder"),
    ],
)
def test_bad_values_exit_2_in_one_line(tmp_path, capsys, extra, message):
    write_image(tmp_path / "imgs" / "c" / "x.png")
    argv = ["--input", str(tmp_path / "imgs"), "--output_dir", str(tmp_path / "o"), "--quiet"]
    argv += [a.format(tmp=tmp_path) for a in extra]
    assert main.main(["convert", *argv]) == main.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("img2tfrecord: error:") and message in err[0], err
    assert not (tmp_path / "o" / MARKER_FILE).exists()


# --- user errors found inside the pipeline ----------------------------------------------------


def _user_error_case(tmp_path: Path, case: str) -> tuple[list[str], str, object]:
    """(extra flags, expected message, a descriptor the CLI must inherit or None) for `case`.

    The field is found by ReadLabels inside the job (the table's parser), after the
    pre-checks; a pipe is refused before the job starts (its header would be consumed by
    the pre-check). Either way: one line, exit 2, the folder as it was found.
    """
    if case == "field over csv's 128 KiB limit":
        (tmp_path / "t.csv").write_text("id,label\nx," + "a" * 140_000 + "\n")
        return ["--labels", str(tmp_path / "t.csv")], "line 2: field larger than field limit (131072)", None
    if case == "labels from a pipe":  # e.g. --labels <(gunzip -c t.csv.gz); its header is read before the job
        read, write = os.pipe()
        os.write(write, b"id,label\nx,cat\n")
        os.close(write)
        return (
            ["--labels", f"/dev/fd/{read}", "--labels_format", "csv"],
            "is not a regular file (a pipe",
            read,
        )
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["field over csv's 128 KiB limit", "labels from a pipe"])
def test_user_errors_found_in_the_pipeline_are_one_line_without_beams_log(tmp_path, case):
    write_image(tmp_path / "imgs" / "c" / "x.png")
    out = tmp_path / "o"
    extra, message, fd = _user_error_case(tmp_path, case)
    argv = ["--input", str(tmp_path / "imgs"), "--output_dir", str(out), "--quiet", *extra]
    proc = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "convert", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        pass_fds=(fd,) if fd is not None else (),
    )
    if fd is not None:
        os.close(fd)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == main.EXIT_USAGE, proc.stderr[-3000:]
    assert len(err) == 1 and err[0].startswith("img2tfrecord: error: ") and message in err[0], proc.stderr[
        -3000:
    ]
    assert "while running" not in err[0]
    assert (
        not out.exists() or os.listdir(out) == []
    )  # no claim or staging folder left: the folder is as found


def test_user_error_text_is_the_stages_line():
    wrapped = (
        'Traceback (most recent call last):\n  ...\nValueError: "img2tfrecord-user-error: labels table t.csv'
        " line 2: bad [x] [while running 'ReadLabels/ParseRows']\"\n\nDuring handling ..."
    )
    assert user_error_text(wrapped) == "labels table t.csv line 2: bad [x]"
    assert user_error_text("RuntimeError: images lost") is None
