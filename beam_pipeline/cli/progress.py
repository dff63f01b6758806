"""Live progress of a local conversion on stderr: a bar on a terminal, log lines otherwise.

A thread polls the run's Progress tally (transforms/progress.py), which the DoFns update when
the in-process runner runs them. The bar fits the terminal's width at each redraw (down to 40
columns, dropping its least useful parts), and shows "listing ..." until the first image is
done. Log lines start with the first listed image, so remote runners stay silent here (their
numbers are Beam counters). For a job outside this process, JobWatch says when it shows no
progress at all.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
from typing import TextIO

from transforms import gcs
from transforms.gcs import split_gcs_path
from transforms.progress import Progress

_TTY_REFRESH_S = 0.5
_BAR_WIDTH = 24
_MIN_BAR = 10
MIN_COLUMNS = 40

# The bar currently drawn on a terminal (its line is not ended), for end_line().
_ACTIVE: list[ProgressReporter] = []


def _fields(listed: int, written: int, failed: int, nbytes: int, seconds: float) -> dict[str, str]:
    """The line's fields; `seconds` is the time spent writing so far (rates and ETA use it)."""
    done = written + failed
    rate = done / seconds if seconds > 0 else 0.0
    if done >= listed and listed:
        eta = "done"
    else:
        eta = f"ETA {_duration((listed - done) / rate)}" if rate > 0 else "ETA -"
    return {
        "count": f"{done:,}/{listed:,}",
        "percent": f"{done / listed if listed else 0.0:.0%}",
        "failed": f"{failed:,}",
        "rate": f"{rate:,.0f}",
        "mb": f"{nbytes / 1e6 / seconds if seconds > 0 else 0.0:.1f}",
        "eta": eta,
    }


# The terminal bar's variants, widest first: (template, with a bar?); the first is the log line.
_VARIANTS = (
    ("{count} images ({percent}), {failed} failed, {rate} images/s, {mb} MB/s, {eta}", True),
    ("{count} images ({percent}), {failed} failed, {rate} images/s, {eta}", True),
    ("{count} ({percent}) {failed} failed {rate}/s {eta}", True),
    ("{count} ({percent}) {failed} failed {eta}", True),
    ("{count} ({percent}) {failed} failed {eta}", False),
    ("{count} {failed} failed {eta}", False),
    ("{count} {failed}F {eta}", False),
)
# What the fields that come and go between redraws take at most in a typical run: the
# layout is chosen for these, so it stays put while the numbers change.
_WIDEST = {"percent": "100%", "failed": "9,999", "rate": "9,999", "mb": "999.9", "eta": "ETA 59m59s"}


def format_progress(listed: int, written: int, failed: int, nbytes: int, seconds: float) -> str:
    """One log line: done/listed, failures, rates and ETA."""
    return "img2tfrecord: " + _VARIANTS[0][0].format(**_fields(listed, written, failed, nbytes, seconds))


def fit_progress(listed: int, written: int, failed: int, nbytes: int, seconds: float, columns: int) -> str:
    """The bar for a terminal `columns` wide, at most `columns` - 1 (a full line wraps on some).

    As the width shrinks, _VARIANTS drop parts in order; below 40 columns the 40-column line is
    cut. The layout is chosen for the widest values the fields take (_WIDEST, the count at its
    end), so it does not change from one redraw to the next as the rates and the ETA do.
    """
    room = max(columns, MIN_COLUMNS) - 1
    done = written + failed
    fields = _fields(listed, written, failed, nbytes, seconds)
    widest = {k: max(v, _WIDEST.get(k, ""), key=len) for k, v in fields.items()}
    widest["count"] = f"{max(done, listed):,}/{listed:,}"
    for template, with_bar in _VARIANTS:
        text, space = template.format(**fields), len(template.format(**widest))
        if not with_bar:
            if space <= room:
                return text
            continue
        width = min(_BAR_WIDTH, room - space - 3)
        if width >= _MIN_BAR:
            filled = int(width * min(1.0, done / listed if listed else 0.0))
            return f"[{'#' * filled}{'.' * (width - filled)}] {text}"
    return _VARIANTS[-1][0].format(**fields)[:room]


def terminal_columns(stream: TextIO) -> int:
    """The width of the terminal behind `stream` (when it has none: COLUMNS, else 80)."""
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return shutil.get_terminal_size().columns


def end_line(stream: TextIO) -> None:
    """Ends the line of a bar being drawn on `stream` (before a message such as Ctrl-C's)."""
    drawing = [r for r in list(_ACTIVE) if r._stream is stream]
    for reporter in drawing:
        reporter._stop.set()  # no redraw after this line
    if any(r._drawn for r in drawing):
        stream.write("\n")
        stream.flush()


def _duration(seconds: float) -> str:
    seconds = int(seconds + 0.5)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class ProgressReporter:
    """Prints `progress` to `stream` from a daemon thread until stop()."""

    def __init__(
        self,
        progress: Progress,
        stream: TextIO,
        interval: float,
        tty: bool | None = None,
        columns: int | None = None,
    ):
        """`columns`: a fixed terminal width (tests); None reads it from the terminal at each redraw."""
        self._progress, self._stream = progress, stream
        self._tty = stream.isatty() if tty is None else tty
        self._columns = columns
        self._drawn = False
        self._interval = _TTY_REFRESH_S if self._tty else interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="img2tfrecord-progress", daemon=True)
        self._last: tuple | None = None

    def start(self) -> ProgressReporter:
        if self._tty:
            _ACTIVE.append(self)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the thread and prints the last state (ends the bar's line on a terminal)."""
        self._stop.set()
        self._thread.join()
        self._emit(final=True)
        if self in _ACTIVE:
            _ACTIVE.remove(self)

    def _loop(self) -> None:
        while True:  # at once, then every interval: "listing ..." shows from the start
            self._emit(final=False)
            if self._stop.wait(self._interval):
                return

    def _emit(self, final: bool) -> None:
        listed, written, failed, nbytes, first_done = self._progress.snapshot()
        seconds = time.monotonic() - first_done if first_done is not None else 0.0
        state = (listed, written, failed, nbytes, seconds)
        if self._tty:
            self._draw(state, first_done is None, final)
        elif listed and state[:3] != self._last:
            self._last = state[:3]
            self._stream.write(format_progress(*state) + "\n")
            self._stream.flush()

    def _draw(self, state: tuple, listing: bool, final: bool) -> None:
        """Redraws the line: "listing ..." until the first image is done, then the bar."""
        columns = self._columns or terminal_columns(self._stream)
        listed = state[0]
        if listing and not (final and listed):
            if final:  # nothing was done: leave the line empty
                if self._drawn:
                    self._stream.write("\r\x1b[K")
                    self._stream.flush()
                return
            text = f"listing ... {listed:,} images found" if listed else "listing ..."
            line = text[: max(columns, MIN_COLUMNS) - 1]
        else:
            line = fit_progress(*state, columns)
        self._stream.write("\r" + line + "\x1b[K" + ("\n" if final else ""))
        self._stream.flush()
        self._drawn = not final


# The logger of the job messages a runner relays while it waits (Dataflow's), at INFO (main.py).
JOB_MESSAGES_LOGGER = "apache_beam.runners.dataflow"


class _Count(logging.Handler):
    """Counts the log records it is given (JobWatch: each a sign of the job's progress)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


# A job outside this process that shows no progress for this long is reported on stderr (then
# again after twice as long, and so on); IMG2TFRECORD_STALL_SECONDS changes it (tests: seconds).
STALL_SECONDS = 180.0
STALL_ENV = "IMG2TFRECORD_STALL_SECONDS"
_WATCH_POLL_MAX = 30.0


def staged_files(folder: str) -> tuple[int, int]:
    """(files, bytes) below `folder` (local, or gs:// in one listing), (0, 0) if it is not there."""
    if folder.startswith("gs://"):
        bucket, prefix = split_gcs_path(folder)
        sizes = [size for _, size in gcs.lister(bucket)(prefix, None)]
        return len(sizes), sum(s or 0 for s in sizes)
    count = total = 0
    for parent, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
                count += 1
    return count, total


class JobWatch:
    """While a job runs outside this process (`with JobWatch(...)`), a daemon thread says on
    `stream` when it has shown no progress for STALL_SECONDS, and again each time that has
    doubled: a job whose workers cannot start (a worker pool that cannot import Beam) waits
    for ever, silently, in Beam's `wait_until_finish`.

    Progress is a change of the job's state, a message the runner logged about it (Dataflow's
    job messages), or a change of what its staging folder holds (files and bytes: shards
    written, metadata staged): the signs every runner gives (Beam's Python job service
    reports counters only at the end). The state is asked of the runner (`ask_state`) only
    where that is safe beside Beam's own wait (a gRPC job service; not Dataflow's client,
    which its wait polls from another thread). Bounds: one state query and one listing of
    the staging folder per check, every STALL_SECONDS / 4 (at most 30 s).
    """

    def __init__(
        self, result, staging: str, stream: TextIO, seconds: float | None = None, ask_state: bool = True
    ):
        self._result, self._staging, self._stream, self._ask_state = result, staging, stream, ask_state
        self._seconds = seconds or float(os.environ.get(STALL_ENV) or STALL_SECONDS)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="img2tfrecord-job-watch", daemon=True)
        self._messages = _Count()

    def __enter__(self) -> JobWatch:
        logging.getLogger(JOB_MESSAGES_LOGGER).addHandler(self._messages)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        logging.getLogger(JOB_MESSAGES_LOGGER).removeHandler(self._messages)
        self._thread.join(_WATCH_POLL_MAX)

    def _signs(self) -> tuple:
        state = None
        if self._ask_state:
            with contextlib.suppress(Exception):  # a runner that cannot say: the rest tells
                state = self._result.state
        try:
            files = staged_files(self._staging)
        except Exception:  # noqa: BLE001 - a store that does not answer now: no sign
            files = None
        return state, self._messages.count, files

    def _loop(self) -> None:
        last, since, report_after = self._signs(), time.monotonic(), self._seconds
        while not self._stop.wait(min(self._seconds / 4, _WATCH_POLL_MAX)):
            signs, now = self._signs(), time.monotonic()
            if signs != last:
                last, since, report_after = signs, now, self._seconds
            elif now - since >= report_after:
                report_after *= 2
                state = f"state {last[0]}, " if last[0] is not None else ""
                self._stream.write(
                    f"img2tfrecord: the job has shown no progress for {_duration(now - since)} ({state}"
                    "no new file in its staging folder); still waiting. If its workers cannot start it "
                    "never ends: see the job server's and the workers' logs\n"
                )
                self._stream.flush()
