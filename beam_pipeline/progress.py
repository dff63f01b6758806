"""Live progress of a local conversion on stderr: a bar on a terminal, log lines otherwise.

A thread polls the run's Progress tally (transforms/progress.py), which the pipeline's DoFns
update in this process when the in-process runner executes them. Nothing is printed until
the first image is listed, so runners whose workers live elsewhere stay silent here (their
numbers are the Beam counters images_listed, images_encoded, images_failed, bytes_written).
"""

from __future__ import annotations

import threading
import time
from typing import TextIO

from transforms.progress import Progress

_TTY_REFRESH_S = 0.5
_BAR_WIDTH = 24


def format_progress(
    listed: int, written: int, failed: int, nbytes: int, seconds: float, *, bar: bool = False
) -> str:
    """One progress line: done/listed, failures, rates and ETA.

    `seconds` is the time spent writing so far (rates and ETA are computed from it).
    """
    done = written + failed
    share = done / listed if listed else 0.0
    rate = done / seconds if seconds > 0 else 0.0
    mb_rate = nbytes / 1e6 / seconds if seconds > 0 else 0.0
    if done >= listed and listed:
        eta = "done"
    elif rate > 0:
        eta = f"ETA {_duration((listed - done) / rate)}"
    else:
        eta = "ETA -"
    text = (
        f"{done:,}/{listed:,} images ({share:.0%}), {failed:,} failed, "
        f"{rate:,.0f} images/s, {mb_rate:.1f} MB/s, {eta}"
    )
    if bar:
        filled = int(_BAR_WIDTH * min(1.0, share))
        return f"[{'#' * filled}{'.' * (_BAR_WIDTH - filled)}] {text}"
    return f"img2tfrecord: {text}"


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

    def __init__(self, progress: Progress, stream: TextIO, interval: float, tty: bool | None = None):
        self._progress, self._stream = progress, stream
        self._tty = stream.isatty() if tty is None else tty
        self._interval = _TTY_REFRESH_S if self._tty else interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="img2tfrecord-progress", daemon=True)
        self._last: tuple | None = None

    def start(self) -> ProgressReporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the thread and prints the last state (ends the bar's line on a terminal)."""
        self._stop.set()
        self._thread.join()
        self._emit(final=True)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._emit(final=False)

    def _emit(self, final: bool) -> None:
        listed, written, failed, nbytes, first_done = self._progress.snapshot()
        state = (listed, written, failed)
        if not listed or (state == self._last and not (final and self._tty)):
            return
        self._last = state
        seconds = time.monotonic() - first_done if first_done is not None else 0.0
        line = format_progress(listed, written, failed, nbytes, seconds, bar=self._tty)
        if self._tty:
            self._stream.write("\r" + line + "\x1b[K" + ("\n" if final else ""))
        else:
            self._stream.write(line + "\n")
        self._stream.flush()
