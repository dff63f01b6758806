"""The run's end: every fault a user can act on ends in one line (exit 2); only a bug is a traceback.

In: the exception a run stopped with, raised in this process or re-raised by a runner with the
job's own traceback as its text, and where the run was (`RunEnd.stage`). Out: the run's last
line, naming the cause, what was kept and what to run next, after the claim on the output
folder was ended as the fault allows (docs/reliability.md, "When something fails"):

- A store that does not answer, a disk or quota that is full, a runner that cannot start, a
  job that failed without a bug of ours (its workers died): one line.
- The claim: a run whose job is not running (it failed, never started, or ran in this process
  or in workers that lived in it) abandons the folder (Claim.abandon: its staging folder
  deleted, a fresh marker removed unless publishing had begun), so the next run proceeds at
  once; a job that may still be running (the launcher lost contact with it) keeps the claim.
  Cleanup asks nothing of a store that does not answer, and waits at most CLEANUP_SECONDS.
- A bug of ours propagates (a traceback, exit 1); the claim is let go as a killed run's.
"""

from __future__ import annotations

import dataclasses
import errno
import pathlib
import re
import threading
from collections.abc import Callable
from typing import TypeVar

from apache_beam.runners.runner import PipelineResult, PipelineState

from beam_pipeline.cli.options import UserError
from transforms import gcs
from transforms.failures import user_error_text
from transforms.output.fence import TAKEN_OVER, Claim, lease_seconds
from transforms.output.publish import MARKER_FILE, SUMMARY_FILE
from transforms.retry import GaveUp, store_of

# Characters of the run's last line ("img2tfrecord: error: " and this text).
MAX_LINE = 300
_PREFIX = len("img2tfrecord: error: ")
# Seconds the cleanup of a failed run may take (deleting its staging folder, removing its
# marker), and a question to the runner about its job's state.
CLEANUP_SECONDS = 30.0
STATE_SECONDS = 10.0

# Kinds of fault.
STORE, SPACE, USER, RUNNER, JOB, LOST = "store", "space", "user", "runner", "job", "lost"
_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_SPACE_TEXT = re.compile(
    r"\[Errno (?:28|122)\] (No space left on device|Disk quota exceeded)(?:: '([^'\n]+)')?"
)
_GAVE_UP_TEXT = re.compile(r"\bGaveUp: ([^\n]+)")
_STORE_DOWN = re.compile(r"(\w+://[^/\s]+) answered nothing but errors")
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception|Exit|Failure|Unavailable)):? ?(.*)$")
_URL = re.compile(r"\b\w+://\S*/([^/\s]+?)(?=[:,;)>]?(?:\s|$)|[.]\s|[.]$)")
_SENTENCE_END = re.compile(r"(?<=[.])\s+(?=[A-Z])")
_LONG_PATH = re.compile(r"(?:\w+://|/)[^\s'\"]{60,}")
_FRAME = re.compile(r'File "([^"]+)"')
_OUR_PACKAGES = frozenset({"transforms", "beam_pipeline"})

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Fault:
    """What stopped a run: `kind` (STORE ... LOST), `cause` (one line), the `store` that does
    not answer if that is the cause (no cleanup is asked of it), and whether `cause` already
    says what to do (a stage's own line: USER_ERROR_MARKER)."""

    kind: str
    cause: str
    store: str | None = None
    complete: bool = False


def _chain(error: BaseException) -> list[BaseException]:
    """`error` and the exceptions it was raised from or while handling."""
    found: list[BaseException] = []
    while error is not None and error not in found:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found


def fault_of(error: BaseException) -> Fault | None:
    """The fault the user can act on behind `error` (in this process, or in a job's text), or None.

    A store that gave up (GaveUp, or StoreUnreachable's line), no space or quota left
    (ENOSPC, EDQUOT), and a stage's user error (transforms.failures.USER_ERROR_MARKER).
    """
    chain = _chain(error)
    for e in chain:
        if isinstance(e, GaveUp):
            return Fault(STORE, f"{e.store or 'the store'} did not answer: {e}", e.store)
        if isinstance(e, OSError) and e.errno in _SPACE_ERRNOS:
            return Fault(SPACE, _out_of_space(e.strerror or "No space left on device", e.filename))
    text = "\n".join(str(e) for e in chain)
    marked = user_error_text(text)
    if marked is not None:
        down = _STORE_DOWN.match(marked)
        return Fault(STORE if down else USER, marked, down[1] if down else None, complete=True)
    if space := _SPACE_TEXT.search(text):
        return Fault(SPACE, _out_of_space(space[1], space[2]))
    if gave_up := _GAVE_UP_TEXT.search(text):
        return Fault(STORE, f"a store did not answer: {gave_up[1]}")
    return None


def _out_of_space(reason: str, path: object = None) -> str:
    where = f" writing {path}" if isinstance(path, str) and path else ""
    return f"out of space: {reason}{where} (bytes or inodes: see df -h and df -i)"


def has_our_frames(text: str) -> bool:
    """True if a traceback in `text` passes through our packages (a bug of ours, or our user error)."""
    for path in _FRAME.findall(text):
        parts = pathlib.PurePath(path.replace("\\", "/")).parts
        if any(p in _OUR_PACKAGES and (i == 0 or parts[i - 1] != "apache_beam") for i, p in enumerate(parts)):
            return True
    return False


def cause_line(error: BaseException) -> str:
    """The innermost line of `error` worth showing: the last `SomeError: message` line of the
    text (a runner's error holds the job's traceback), its first sentence, URLs cut to their
    file name, without a bare RuntimeError's name."""
    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    found = next((m for line in reversed(lines) if (m := _EXCEPTION_LINE.match(line)) and m[2]), None)
    kind, line = (found[1], found[2]) if found else (type(error).__name__, lines[0] if lines else "")
    line = _SENTENCE_END.split(_URL.sub(lambda m: f"…/{m[1]}", line), maxsplit=1)[0]
    line = line.rstrip(". ")
    return line if kind in ("RuntimeError", "Exception") else f"{kind}: {line}"


def _answers(output_dir: str) -> bool:
    """True if the store of `output_dir` (gs://) answers one quick request: else the cleanup of
    a failed run asks it nothing."""
    return gcs.answers(f"{output_dir.rstrip('/')}/{MARKER_FILE}")


def shorten(text: str, room: int) -> str:
    """`text` in at most `room` characters: long paths and URLs cut in the middle first, then
    the text before its first "; " (what to do, after it, is kept), then the end."""
    for long in sorted(set(_LONG_PATH.findall(text)), key=len, reverse=True):
        if len(text) <= room:
            break
        text = text.replace(long, f"{long[:32]}…{long[-24:]}")
    what, sep, then = text.partition("; ")
    if len(text) > room and sep and len(then) + 20 < room:
        text = _cut(what, room - len(sep) - len(then)) + sep + then
    return _cut(text, room)


def _cut(text: str, room: int) -> str:
    return text if len(text) <= room else text[: max(room - 1, 10)].rstrip() + "…"


def bounded(fn: Callable[[], T], seconds: float) -> tuple[bool, T | None]:
    """(True, fn()) if `fn` returned within `seconds`; (False, None) if it raised or took longer
    (it then goes on in a daemon thread: the CLI exits right after)."""
    out: list = []

    def call() -> None:
        try:
            out.append(fn())
        except Exception:  # noqa: BLE001 - best effort: the caller says what was left
            pass

    thread = threading.Thread(target=call, name="img2tfrecord-cleanup", daemon=True)
    thread.start()
    thread.join(seconds)
    return (True, out[0]) if out else (False, None)


# Where a run is when it stops: the checks, building the graph, a remote runner starting the
# job (its creation and the submission), the job running, or after the job.
CHECKS, GRAPH, STARTING, RUNNING, AFTER = "checks", "graph", "starting", "running", "after"


class RunEnd:
    """Ends a run whatever stops it (see the module docstring). main.py moves `stage` on and
    sets `claim` and `result` as the run gets them; `stop(error)` at the end.

    Args:
      output_dir: the run's --output_dir.
      runner: the --runner given (None: the local runner).
      local: the local runner: the job runs in this process, within `p.run()`.
      in_launcher: the job's steps run in this process's workers (LOOPBACK), which die with
        it: the job is over when the run stops, and it holds the claim as a local run does.
    """

    def __init__(self, output_dir: str, runner: str | None, *, local: bool, in_launcher: bool = False):
        self.output_dir, self.runner = output_dir, runner
        self.local, self.in_launcher = local, in_launcher
        self.stage = CHECKS
        self.claim: Claim | None = None
        self.result: PipelineResult | None = None

    @property
    def job_outlives_launcher(self) -> bool:
        return not (self.local or self.in_launcher)

    def finish(self, over: bool = False) -> None:
        """The run published its dataset (publishing removed the marker), or (`over`) its job
        stopped short on purpose and a marker left in the folder has its lease ended."""
        if self.claim is not None:
            self.claim.release(over=over)

    def stop(self, error: BaseException) -> str | None:
        """Ends the claim as `error` allows; returns the run's last line, or None if `error`
        is to propagate as it is (a UserError already one line, a bug, an interruption)."""
        if isinstance(error, UserError):
            self._abandon(None)
            return None
        fault = fault_of(error) if isinstance(error, Exception) else None
        over = not self.job_outlives_launcher or self.stage != RUNNING or self._job_ended()
        if fault is None and not self.local and self.stage == STARTING and isinstance(error, Exception):
            fault = Fault(RUNNER, cause_line(error))
        if fault is None and not self.local and self.stage == RUNNING and not has_our_frames(str(error)):
            fault = Fault(JOB if over else LOST, cause_line(error))
        if fault is None or fault.kind == LOST:
            if self.claim is not None:
                self.claim.release(over=over and fault is None)
            return None if fault is None else self._line(fault, "")
        return self._line(fault, self._abandon(fault))

    def _job_ended(self) -> bool:
        """True if the runner says the job is over (asked at most STATE_SECONDS)."""
        result = self.result
        if result is None:
            return True  # never submitted
        answered, state = bounded(lambda: result.state, STATE_SECONDS)
        return answered and PipelineState.is_terminal(state)

    def _abandon(self, fault: Fault | None) -> str:
        """Abandons the claim (within CLEANUP_SECONDS, nothing asked of a store that does not
        answer); returns what the folder holds, for the line ('' if as it was)."""
        claim, out = self.claim, self.output_dir
        if claim is None:
            return ""
        after = f" {lease_seconds():.0f} s after this one" if "://" in out else ""
        left = f"its marker and staged files stay (the next run takes them over{after})"
        store = store_of(out)
        if store is not None and fault is not None and (fault.store == store or not _answers(out)):
            claim.let_go()
            return left
        done, changed = bounded(claim.abandon, CLEANUP_SECONDS)
        if fault is not None and fault.cause.startswith(TAKEN_OVER):
            return ""  # the folder is the other run's: its line says so, what it holds is not ours
        if not done:
            return left
        if changed:
            return (
                f"publishing had begun, so {out} is unfinished (its marker stays) until a rerun replaces it"
            )
        if claim.resumed is not None:
            return "the earlier run's unfinished output stays until a rerun replaces it"
        if claim.found and SUMMARY_FILE in claim.found:
            return "nothing was published and the dataset already there is kept, finished"
        return ""

    def _line(self, fault: Fault, left: str) -> str:
        """The last line: cause; what was kept; what to do (the cause shortened to fit MAX_LINE)."""
        out, runner = self.output_dir, self.runner
        kept = left or "nothing was published and the output folder is as it was"
        head, rest = (
            {
                STORE: ("", f"; {kept}; rerun when it is reachable"),
                SPACE: ("", f"; {kept}; free some space and rerun the same command"),
                RUNNER: (
                    f"--runner {runner} could not start the job (",
                    f"); {left or 'nothing was written'}; rerun without --runner (the local runner) "
                    "or see docs/cloud.md",
                ),
                JOB: (
                    f"the {runner} job failed (",
                    f"); {kept}; rerun the same command (workers killed or out of memory? see the worker logs)",
                ),
                LOST: (
                    f"lost contact with the {runner} job (",
                    f"); it may still be running and keeps {out} until it ends (or {lease_seconds():.0f} s "
                    "after its last beat); check the job, then rerun the same command",
                ),
            }[fault.kind]
            if not fault.complete
            else ("", f"; {left}" if left else "")
        )
        room = MAX_LINE - _PREFIX - len(head) - len(rest)
        return head + shorten(fault.cause, room) + rest
