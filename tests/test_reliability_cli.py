"""Bad command lines and occupied outputs: one line on stderr, exit 2, nothing written."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from beam_pipeline import main
from tests.conftest import write_image
from transforms.output import MARKER_FILE


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
        (["--output_dir", "{tmp}/imgs/c/x.png"], "not writable"),
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


def test_output_being_written_by_a_live_run_is_refused(tmp_path, capsys):
    write_image(tmp_path / "imgs" / "c" / "x.png")
    out = tmp_path / "o"
    out.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    marker = {"run_id": "other", "pid": sleeper.pid, "host": socket.gethostname()}
    try:
        (out / MARKER_FILE).write_text(json.dumps(marker))
        argv = ["--input", str(tmp_path / "imgs"), "--output_dir", str(out), "--overwrite", "--quiet"]
        assert main.main(argv) == main.EXIT_USAGE
    finally:
        sleeper.kill()
        sleeper.wait()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "being written by another img2tfrecord run" in err[0]
    assert json.loads((out / MARKER_FILE).read_text()) == marker  # left alone
