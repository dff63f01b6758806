"""Live progress (log lines, --quiet), the read-ahead pool, and the local runner defaults."""

from __future__ import annotations

import io
import re
import threading
import time

import pytest

from beam_pipeline import main
from beam_pipeline.cli import local_runner
from beam_pipeline.cli.progress import ProgressReporter, fit_progress, format_progress
from tests.conftest import write_image
from transforms.images.prefetch import map_in_order
from transforms.progress import Progress

LINE = re.compile(
    r"^img2tfrecord: (?P<done>[\d,]+)/(?P<listed>[\d,]+) images \(\d+%\), (?P<failed>\d+) failed, "
    r"[\d,]+ images/s, [\d.]+ MB/s, (ETA \S+|done)$"
)


def test_format_progress():
    assert format_progress(100, 20, 5, 2_000_000, 2.0) == (
        "img2tfrecord: 25/100 images (25%), 5 failed, 12 images/s, 1.0 MB/s, ETA 6s"
    )
    assert format_progress(10, 9, 1, 0, 1.0).endswith("done")
    assert format_progress(10, 0, 0, 0, 0.0).endswith("0 images/s, 0.0 MB/s, ETA -")
    bar = fit_progress(8, 4, 0, 0, 1.0, columns=120)
    assert bar.startswith("[" + "#" * 12 + "." * 12 + "] 4/8 images (50%)")


# (listed, written, failed, bytes, seconds): from the first image to a big, slow, failing run.
_STATES = [
    (1, 0, 0, 0, 0.0),
    (16_000, 9_000, 216, 99_600_000, 4.0),
    (12_345_678, 1_234_567, 12_345, 987_654_321_000, 3_600.5),
    (987_654_321, 987_654_321, 0, 10**15, 400_000.0),
]


@pytest.mark.parametrize("columns", [80, 40])
@pytest.mark.parametrize("state", _STATES)
def test_the_bar_fits_the_terminal(columns, state):
    line = fit_progress(*state, columns=columns)
    assert len(line) <= columns - 1, (len(line), line)  # the last column stays free: no wrap
    listed, written, failed = state[:3]
    assert f"{written + failed:,}/{listed:,}" in line
    assert re.search(r"(ETA \S+|done)$", line)


def test_the_bar_keeps_most_at_80_columns_and_the_essentials_at_40():
    state = (16_000, 9_000, 216, 99_600_000, 4.0)
    wide = fit_progress(*state, columns=80)
    assert wide == "[#############...........] 9,216/16,000 (58%) 216 failed 2,304/s ETA 3s"
    assert "MB/s" in fit_progress(*state, columns=100)
    narrow = fit_progress(*state, columns=40)
    assert narrow == "9,216/16,000 216 failed ETA 3s"
    assert fit_progress(*state, columns=20) == narrow  # below 40: the 40-column line


@pytest.mark.parametrize("columns", [120, 100, 80, 60, 40])
def test_the_bar_keeps_its_width_and_parts_from_redraw_to_redraw(columns):
    """The rates, the ETA and the failures change at every redraw: the layout does not."""
    frames = [
        fit_progress(20_000, written, failed, nbytes, seconds, columns)
        for written, failed, nbytes, seconds in [
            (0, 0, 0, 0.0),
            (3, 1, 40_000, 0.4),
            (900, 12, 95_000_000, 3.0),
            (9_000, 216, 1_234_000_000, 9.5),
            (19_000, 1_000, 2_900_000_000, 400.0),
            (19_700, 300, 3_000_000_000, 4_000.0),
        ]
    ]
    bars = {f.index("]") if f.startswith("[") else None for f in frames}
    assert len(bars) == 1, frames
    parts = {tuple(re.findall(r"[a-zA-Z/]+", re.sub(r"ETA \S+|done", "", f))) for f in frames}
    assert len(parts) == 1, frames


@pytest.mark.parametrize("columns", [80, 40])
def test_reporter_on_a_terminal_lists_first_then_draws_within_the_width(columns):
    progress, out = Progress(), io.StringIO()
    reporter = ProgressReporter(progress, out, interval=0.01, tty=True, columns=columns).start()
    deadline = time.monotonic() + 60  # a bound for a broken reporter, not a timing
    while "listing ..." not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    progress.add(listed=12_345)
    while "12,345 images found" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    progress.add(written=12_000, failed=345, nbytes=10**9)
    reporter.stop()
    frames = [f.removesuffix("\x1b[K") for f in out.getvalue().rstrip("\n").split("\r") if f]
    frames = [f.removesuffix("\n").removesuffix("\x1b[K") for f in frames]
    assert frames[0] == "listing ..."
    assert "listing ... 12,345 images found" in frames
    assert frames[-1].startswith("12,345/12,345") or "12,345/12,345" in frames[-1]
    assert frames[-1].endswith("done")
    assert all(len(f) <= columns - 1 for f in frames), [f for f in frames if len(f) >= columns]
    assert out.getvalue().endswith("\n")


def test_ctrl_c_message_goes_below_the_bar():
    from beam_pipeline.cli.progress import end_line

    progress, out = Progress(), io.StringIO()
    progress.add(listed=4, written=1)
    reporter = ProgressReporter(progress, out, interval=0.01, tty=True, columns=80).start()
    deadline = time.monotonic() + 60  # a bound for a broken reporter, not a timing
    while "1/4" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    end_line(out)
    drawn = out.getvalue()
    assert drawn.endswith("\n") and "1/4" in drawn.rsplit("\r", 1)[-1]
    time.sleep(0.05)
    assert out.getvalue() == drawn  # no redraw after the line was ended
    reporter.stop()


def test_reporter_prints_periodic_lines_and_a_final_one():
    progress, out = Progress(), io.StringIO()
    reporter = ProgressReporter(progress, out, interval=0.01, tty=False).start()
    time.sleep(0.05)
    assert out.getvalue() == ""  # nothing before the first image is listed
    progress.add(listed=4)
    progress.add(written=1, nbytes=10)
    deadline = time.monotonic() + 60  # a bound for a broken reporter, not a timing
    while "1/4" not in out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    progress.add(written=2, failed=1, nbytes=20)
    reporter.stop()
    lines = out.getvalue().splitlines()
    assert all(LINE.match(line) for line in lines), lines
    assert lines[0].startswith("img2tfrecord: 1/4 images (25%), 0 failed")
    assert lines[-1].startswith("img2tfrecord: 4/4 images (100%), 1 failed") and lines[-1].endswith("done")
    assert len(lines) == len(set(lines))  # an unchanged state is not repeated


def test_reporter_draws_a_bar_on_a_terminal():
    progress, out = Progress(), io.StringIO()
    progress.add(listed=2, written=2)
    ProgressReporter(progress, out, interval=10, tty=True, columns=100).start().stop()
    assert out.getvalue().rsplit("\r", 1)[-1].startswith("[" + "#" * 24 + "] 2/2 images (100%)")
    assert out.getvalue().endswith("\n")


def test_map_in_order_keeps_order_bounds_read_ahead_and_returns_errors_per_item():
    from concurrent.futures import ThreadPoolExecutor

    running, most = 0, 0
    lock = threading.Lock()

    def work(i: int) -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.001 * (i % 3))
        with lock:
            running -= 1
        if i == 5:
            raise ValueError("five")
        return i * i

    with ThreadPoolExecutor(4) as pool:
        got = []
        for item, result in map_in_order(work, range(40), pool, ahead=3):
            try:
                got.append((item, result()))
            except ValueError as e:
                got.append((item, str(e)))
    assert got == [(i, "five" if i == 5 else i * i) for i in range(40)]
    assert most <= 3
    assert [(i, r()) for i, r in map_in_order(lambda i: -i, [1, 2], None)] == [(1, -1), (2, -2)]


@pytest.fixture
def jpeg_tree(tmp_path):
    root = tmp_path / "images"
    for i in range(24):
        write_image(root / f"class{i % 3}" / f"{i:02d}.jpg", (40 + i, 30), seed=i)
    (root / "class0" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 truncated")
    return root


def test_convert_reports_progress_unless_quiet_and_threads_keep_bytes(jpeg_tree, tmp_path, capsys):
    threaded = tmp_path / "threaded"
    summary = main.run(
        [
            "--input",
            str(jpeg_tree),
            "--output_dir",
            str(threaded),
            "--progress_interval",
            "0.05",
            "--max_failure_ratio",
            "0.5",
        ],
        save_main_session=False,
    )
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("img2tfrecord:")]
    assert lines and all(LINE.match(line) for line in lines), lines
    last = LINE.match(lines[-1])
    assert (last["done"], last["listed"], last["failed"]) == ("25", "25", "1")
    assert summary["listed"] == 25 and summary["written"] == 24

    single = tmp_path / "single"
    main.run(
        [
            "--input",
            str(jpeg_tree),
            "--output_dir",
            str(single),
            "--quiet",
            "--read_threads",
            "1",
            "--max_failure_ratio",
            "0.5",
        ],
        save_main_session=False,
    )
    assert "images/s" not in capsys.readouterr().err
    shard = "train-00000-of-00001.tfrecord"
    assert (threaded / shard).read_bytes() == (single / shard).read_bytes()


def test_local_defaults_and_overrides():
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions

    options = PipelineOptions([])
    local_runner.local_defaults(options, [])
    assert options.view_as(StandardOptions).runner == local_runner.LOCAL_RUNNER
    direct = options.view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == ("in_memory", 1)
    assert local_runner.in_process(options)
    options = PipelineOptions(["--direct_num_workers=2"])
    local_runner.local_defaults(options, ["--direct_num_workers=2"])
    assert options.view_as(DirectOptions).direct_running_mode == "multi_threading"
    assert local_runner.in_process(options)
    given = ["--direct_running_mode=multi_processing", "--direct_num_workers=3"]
    options = PipelineOptions(given)
    local_runner.local_defaults(options, given)
    direct = options.view_as(DirectOptions)
    assert (direct.direct_running_mode, direct.direct_num_workers) == ("multi_processing", 3)
    assert not local_runner.in_process(options)
