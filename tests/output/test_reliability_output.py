"""Atomic output and reruns: killed runs leave nothing that looks finished, retries converge.

The fault-injection test runs the real CLI in a subprocess, SIGKILLs it at a chosen point
(inside WriteShardFn, and halfway through publishing), checks the output folder, reruns
the same command and compares every output file byte for byte with an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import METADATA_FILES, read_records, write_image
from transforms.output.claim import claim_output
from transforms.output.publish import MARKER_FILE, OutputBusy, list_children, publish
from transforms.testhooks import PAUSE_ENV

FINISHED = ("summary.json", "labels.txt", "failures.jsonl")


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def _looks_finished(out: Path) -> list[str]:
    """Names in `out` that a reader would take for (part of) a finished dataset."""
    return [n for n in list_children(str(out)) if n in FINISHED or n.endswith(".tfrecord")]


# --- claim_output / publish, without Beam -------------------------------------------------


def _dataset(out: Path, shards: int, marker: dict | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        (out / f"train-{i:05d}-of-{shards:05d}.tfrecord").write_bytes(b"old")
    for name in FINISHED:
        (out / name).write_text("old")
    if marker is not None:
        (out / MARKER_FILE).write_text(json.dumps(marker))


def test_finished_or_unknown_output_needs_overwrite(tmp_path):
    _dataset(tmp_path / "done", 2)
    with pytest.raises(OutputBusy, match="already holds a dataset; pass --overwrite"):
        claim_output(str(tmp_path / "done"), False, "r1")
    assert not (tmp_path / "done" / MARKER_FILE).exists()  # a refused claim leaves nothing
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "val-00000-of-00001.tfrecord.gz").write_bytes(b"theirs")
    with pytest.raises(OutputBusy):
        claim_output(str(tmp_path / "foreign"), False, "r1")
    claim = claim_output(str(tmp_path / "done"), True, "r1")
    claim.release()
    assert claim.resumed is None
    assert json.loads((tmp_path / "done" / MARKER_FILE).read_text())["run_id"] == "r1"


def test_interrupted_run_is_replaced_without_overwrite(tmp_path):
    out = tmp_path / "o[1]*"
    _dataset(out, 3, marker={"run_id": "dead", "pid": 2**22 + 7, "host": socket.gethostname()})
    (out / "beam-temp-img2tfrecord-dead" / "train").mkdir(parents=True)
    (out / "beam-temp-img2tfrecord-dead" / "train" / "00000-x.tfrecord").write_bytes(b"partial")
    claim = claim_output(str(out), False, "new")  # no --overwrite needed for a retry
    claim.release()
    assert claim.resumed == "dead"
    assert not (out / "beam-temp-img2tfrecord-dead").exists()


def test_publish_replaces_everything_and_can_be_repeated(tmp_path):
    out = tmp_path / "out"
    _dataset(out, 3)
    (out / "notes.txt").write_text("the user's own file")
    staging = tmp_path / "staging"
    staging.mkdir()
    moves = []
    for name in ("s0", "failures.jsonl", "labels.txt", "summary.json"):
        (staging / name).write_text(f"new {name}")
    moves = [(str(staging / "s0"), "train-00000-of-00001.tfrecord")]
    moves += [(str(staging / n), n) for n in ("failures.jsonl", "labels.txt", "summary.json")]
    (out / MARKER_FILE).write_text("{}")
    publish(str(out), moves)
    expected = {
        "failures.jsonl": b"new failures.jsonl",
        "labels.txt": b"new labels.txt",
        "notes.txt": b"the user's own file",
        "summary.json": b"new summary.json",
        "train-00000-of-00001.tfrecord": b"new s0",
    }
    assert _files(out) == expected
    publish(str(out), moves)  # a retried finalize: everything already in place
    assert _files(out) == expected
    (out / "summary.json").unlink()
    with pytest.raises(FileNotFoundError, match="never published"):
        publish(str(out), moves)


# --- SIGKILL and rerun, end to end ----------------------------------------------------------


@pytest.fixture(scope="module")
def small_tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("kill") / "images"
    for i in range(12):
        write_image(root / ("cat", "dog", "eel")[i % 3] / f"{i:02d}.png", (10 + i, 12), seed=i)
    (root / "cat" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    return root


def _kill_at(point: str, args: list[str], flag: Path) -> None:
    """Runs the CLI in a subprocess and SIGKILLs it the moment it reaches `point`."""
    env = {**os.environ, PAUSE_ENV: f"{point}:{flag}"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", "convert", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not flag.exists():
            assert proc.poll() is None, f"the run ended before {point}: {proc.stderr.read().decode()[-2000:]}"
            assert time.monotonic() < deadline, f"the run never reached {point}"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


def _args_for(root: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--input",
        str(root),
        "--output_dir",
        str(out),
        "--num_shards",
        "3",
        "--splits",
        "train=0.5,validation=0.5",
        "--max_failure_ratio",
        "0.2",
        "--quiet",
        *extra,
    ]


def test_sigkill_then_rerun_gives_the_uninterrupted_output(small_tree, tmp_path):
    reference = tmp_path / "reference"
    summary = main.run(_args_for(small_tree, reference), save_main_session=False)
    assert summary["written"] == 12 and summary["failed"] == 1
    expected = _files(reference)
    assert len([n for n in expected if n.endswith(".tfrecord")]) == 6  # 3 shards x 2 splits

    # Killed while writing a shard: temp files exist, nothing looks finished.
    out = tmp_path / "out"
    _kill_at("write_shard", _args_for(small_tree, out), tmp_path / "flag1")
    assert _looks_finished(out) == []
    assert (out / MARKER_FILE).exists()
    assert any(n.startswith("beam-temp-img2tfrecord-") for n in os.listdir(out))
    # The retry (same command, no --overwrite) is not refused and converges.
    main.run(_args_for(small_tree, out), save_main_session=False)
    assert _files(out) == expected
    assert sorted(os.listdir(out)) == sorted(expected)

    # Killed halfway through publishing over a finished dataset (--overwrite): the old
    # summary.json is gone first, so the folder no longer claims to hold a finished dataset.
    _kill_at("publish", _args_for(small_tree, out, "--overwrite"), tmp_path / "flag2")
    assert not (out / "summary.json").exists() and (out / MARKER_FILE).exists()
    main.run(_args_for(small_tree, out, "--overwrite"), save_main_session=False)
    assert _files(out) == expected and sorted(os.listdir(out)) == sorted(expected)

    # --overwrite with fewer shards: none of the old shards survive.
    main.run(
        _args_for(small_tree, out, "--overwrite", "--num_shards", "1", "--splits", ""),
        save_main_session=False,
    )
    assert sorted(os.listdir(out)) == sorted(METADATA_FILES + ["train-00000-of-00001.tfrecord"])
    assert len(read_records(out)) == 12


def _live_members(pgid: int) -> list[int]:
    """Processes of group `pgid` still running (zombies, which this VM's init may never
    reap, are not)."""
    live = []
    for entry in os.listdir("/proc"):
        try:
            stat = Path("/proc", entry, "stat").read_text()
        except (OSError, ValueError):
            continue
        state, _, group = stat.rpartition(")")[2].split()[:3]
        if int(group) == pgid and state != "Z":
            live.append(int(entry))
    return live


def test_ctrl_c_stops_with_one_line_and_the_rerun_converges(small_tree, tmp_path):
    """SIGINT to the whole process group, as a terminal sends it, in the middle of a shard."""
    reference = tmp_path / "reference"
    main.run(_args_for(small_tree, reference), save_main_session=False)
    out, flag = tmp_path / "out", tmp_path / "flag"
    proc = subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", "convert", *_args_for(small_tree, out)],
        env={**os.environ, PAUSE_ENV: f"write_shard:{flag}"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not flag.exists():
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the run never reached write_shard"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    err = err.decode()
    assert proc.returncode == main.EXIT_INTERRUPTED
    assert err.count("img2tfrecord: interrupted") == 1 and "Traceback" not in err, err
    deadline = time.monotonic() + 60  # the writers exit on the SIGINT; how soon depends on the load
    while _live_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _live_members(proc.pid) == [], "a shard writer outlived the run"
    assert _looks_finished(out) == [] and (out / MARKER_FILE).exists()
    rerun = subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "convert", *_args_for(small_tree, out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    # One line for the user, not a raw log record ("WARNING root: ...").
    assert rerun.stderr.splitlines()[0].startswith(
        "img2tfrecord: replacing the unfinished output of an earlier run ("
    ), rerun.stderr
    assert "WARNING" not in rerun.stderr, rerun.stderr
    assert _files(out) == _files(reference)


def test_overwrite_that_ends_in_exit_3_keeps_the_previous_dataset(small_tree, tmp_path, capsys):
    out = tmp_path / "out"
    main.run(_args_for(small_tree, out), save_main_session=False)
    good = _files(out)
    bad = tmp_path / "mostly-broken"
    write_image(bad / "cat" / "ok.png", seed=1)
    for i in range(3):
        (bad / "dog" / f"{i}.png").parent.mkdir(parents=True, exist_ok=True)
        (bad / "dog" / f"{i}.png").write_bytes(b"\x89PNG\r\n\x1a\n cut short")
    assert main.main(_args_for(bad, out, "--overwrite")) == main.EXIT_TOO_MANY_FAILURES
    # The old dataset, byte for byte and finished (no marker); the new run's failures beside it.
    kept = _files(out)
    assert {name: kept.get(name) for name in good} == good
    failures = kept.pop("aborted-failures.jsonl").decode().splitlines()
    assert kept == good and sorted(os.listdir(out)) == sorted([*good, "aborted-failures.jsonl"])
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "3 of 4 images failed" in err[0] and "the dataset already there is kept" in err[0]
    )
    assert sorted(json.loads(f)["path"].rsplit("/", 1)[1] for f in failures) == ["0.png", "1.png", "2.png"]
    assert len(read_records(out, "train")) + len(read_records(out, "validation")) == 12
    # The next published dataset replaces both.
    main.run(_args_for(bad, out, "--overwrite", "--max_failure_ratio", "1"), save_main_session=False)
    assert "aborted-failures.jsonl" not in os.listdir(out) and not (out / MARKER_FILE).exists()
