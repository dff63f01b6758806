"""The img2tfrecord DAGs' operators: the CLI run as a task, and the Flex Template launch.

In: the command line the Beam provider builds (`$IMG2TFRECORD_PYTHON -m beam_pipeline
--runner=... --flag=value ...`), or the Flex launch body. Out: the task's log and outcome.

- **The log.** Every line the CLI prints goes to the task log at its own level: the CLI's
  one-line error (`img2tfrecord: error: ...`) and tracebacks as ERROR, Beam's `WARNING ...`
  records as WARNING, progress and summary lines as INFO (the provider logs all of stderr as
  warnings).
- **The outcome.** Exit 2 (bad options or input) and exit 3 (too many failed images) cannot
  succeed on a retry: AirflowFailException, whose message is the CLI's own line. Everything
  else (exit 1 from a store outage, a killed process) is an AirflowException, retried. So is
  exit 2 for an output folder held by a live run (an earlier try's conversion still running).
- **Kill means stop.** The CLI runs in its own process group; `on_kill` (Airflow's SIGTERM,
  a timeout) terminates the group, so no Beam process outlives the task. One that does (the
  task process SIGKILLed) keeps the output folder's claim: a retry stops at the claim
  (`is being written by another img2tfrecord run`) instead of writing beside it.
- **Before launching**, a run's conf is checked against the DAG's params (a misspelt key is
  refused, not ignored) and the launch time is kept (XCom `started`), so check_summary can tell
  a dataset of this run from an older one.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from airflow.providers.apache.beam.hooks.beam import BeamHook, beam_options_to_args
from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

# The CLI's exit statuses that a retry cannot change (README.md "Exit status").
EXIT_USAGE, EXIT_TOO_MANY_FAILURES = 2, 3
ERROR_PREFIX = "img2tfrecord: error:"
# Exit 2 because another live run holds the output folder (transforms/output/claim.py): retried.
FOLDER_BUSY = re.compile(r"is being written by|claimed by another img2tfrecord run|keep claiming it")
# The XCom key of the launch time (seconds since the epoch), read by check_summary.
STARTED_KEY = "started"
# How long a terminated CLI gets to exit before its process group is killed.
STOP_GRACE_SECONDS = 5.0
_LEVELS = {name: getattr(logging, name) for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}


def line_level(line: str, previous: int) -> int:
    """The log level of one line of the CLI's output; a line without a level of its own (a
    traceback's body, a message's second line) takes the level of the line before it."""
    if line.startswith((ERROR_PREFIX, "Traceback")):
        return logging.ERROR
    if line.startswith("img2tfrecord:"):
        return logging.INFO
    return _LEVELS.get(line.split(" ", 1)[0].rstrip(":"), previous)


def outcome(returncode: int, reason: str) -> AirflowException | None:
    """The task's exception for the CLI's exit status (None: success). `reason` is the CLI's
    last error line (else its last line)."""
    if returncode == 0:
        return None
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return AirflowException(f"img2tfrecord was stopped by {name}")
    if returncode in (EXIT_USAGE, EXIT_TOO_MANY_FAILURES) and not FOLDER_BUSY.search(reason):
        return AirflowFailException(reason or f"img2tfrecord exited with status {returncode}")
    return AirflowException(f"{reason} (exit status {returncode}: retried)")


class ToolProcess:
    """One run of the CLI: started in its own process group, its output logged line by line."""

    def __init__(self, cmd: list[str], log: logging.Logger | logging.LoggerAdapter):
        self.cmd, self.log = cmd, log
        self.proc: subprocess.Popen | None = None
        self._level = logging.INFO
        self._last, self._error = "", ""

    def run(
        self,
        on_line: Callable[[str], None] | None = None,
        detach_when: Callable[[], bool] | None = None,
        cwd: str | None = None,
    ) -> None:
        """Runs the command to its end and raises outcome()'s exception, or returns early once
        `detach_when()` holds (a Dataflow job was submitted: the launcher's output is then
        logged by a thread while the task waits for the job)."""
        self.log.info("Running command: %s", " ".join(self.cmd))
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, for stop()
        )
        for raw in self.proc.stdout:
            self._log_line(raw.decode("utf-8", "replace").rstrip("\n"), on_line)
            if detach_when is not None and detach_when():
                threading.Thread(target=self._drain, daemon=True).start()
                return
        error = outcome(self.proc.wait(), self._error or self._last)
        if error is not None:
            raise error

    def _log_line(self, line: str, on_line: Callable[[str], None] | None = None) -> None:
        if on_line is not None:
            on_line(line)
        self._level = line_level(line, self._level)
        self.log.log(self._level, "%s", line)
        if line.strip():
            self._last = line.strip()
            if line.startswith(ERROR_PREFIX):
                self._error = self._last

    def _drain(self) -> None:
        for raw in self.proc.stdout:
            self._log_line(raw.decode("utf-8", "replace").rstrip("\n"))

    def stop(self) -> None:
        """Terminates the CLI's process group (SIGTERM, then SIGKILL after a grace period)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.log.info(
            "Stopping img2tfrecord: SIGTERM to its process group %d. A conversion that outlived "
            "its task would keep the output folder's claim: a retry stops at the claim (`is being "
            "written by another img2tfrecord run`) rather than write beside it.",
            self.proc.pid,
        )
        _signal_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


class ToolBeamHook(BeamHook):
    """The Beam provider's hook, its command run by ToolProcess (levels, outcome, stop)."""

    def __init__(self, runner: str):
        super().__init__(runner=runner)
        self.tool: ToolProcess | None = None

    def _start_pipeline(
        self,
        variables: dict,
        command_prefix: list[str],
        process_line_callback: Callable[[str], None] | None = None,
        working_directory: str | None = None,
        is_dataflow_job_id_exist_callback: Callable[[], bool] | None = None,
    ) -> None:
        cmd = [*command_prefix, f"--runner={self.runner}", *beam_options_to_args(variables)]
        self.tool = ToolProcess(cmd, self.log)
        self.tool.run(process_line_callback, is_dataflow_job_id_exist_callback, working_directory)


def before_launch(task, context) -> None:
    """Refuses conf keys the DAG has no param for, keeps the launch time (XCom `started`)
    and, on a retry, says what happens to an earlier try's conversion that is still running."""
    known = set(task.dag.params)
    unknown = sorted(set(context["dag_run"].conf or {}) - known)
    if unknown:
        hints = [
            f"{key!r}" + "".join(f" (did you mean {m!r}?)" for m in difflib.get_close_matches(key, known, 1))
            for key in unknown
        ]
        raise AirflowFailException(
            f"unknown conf key {', '.join(hints)}; {task.dag.dag_id} takes {', '.join(sorted(known))}"
        )
    context["ti"].xcom_push(key=STARTED_KEY, value=time.time())
    if context["ti"].try_number > 1:
        task.log.info(
            "Try %d: if an earlier try's conversion still runs, this one stops at the output "
            "folder's claim (`is being written by another img2tfrecord run`) and is retried later.",
            context["ti"].try_number,
        )


class ConvertOperator(BeamRunPythonPipelineOperator):
    """`python -m beam_pipeline ...` as the provider runs it, through ToolProcess."""

    def execute(self, context):
        before_launch(self, context)
        return super().execute(context)

    def _init_pipeline_options(self, *args, **kwargs):
        options = super()._init_pipeline_options(*args, **kwargs)
        self.beam_hook = ToolBeamHook(runner=self.runner)
        return options

    def on_kill(self) -> None:
        hook = getattr(self, "beam_hook", None)
        if isinstance(hook, ToolBeamHook) and hook.tool is not None:
            hook.tool.stop()
        super().on_kill()  # Dataflow: cancels the job


class FlexLaunchOperator(DataflowStartFlexTemplateOperator):
    """The Flex Template launch, after the conf check (before_launch)."""

    def execute(self, context):
        before_launch(self, context)
        return super().execute(context)
