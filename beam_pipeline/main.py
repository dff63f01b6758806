"""Entry points: `img2tfrecord <command>` / `python -m beam_pipeline <command>`.

`run(argv)` runs a conversion and returns its summary; `main(argv)` is the CLI, which turns
user errors into one line on stderr and an exit status.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import os
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from typing import TypeVar

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    PipelineOptions,
    SetupOptions,
    StandardOptions,
    TestOptions,
)
from apache_beam.runners.runner import PipelineResult

from beam_pipeline.cli import help as cli_help
from beam_pipeline.cli.argv import check_args, did_you_mean
from beam_pipeline.cli.checks import (
    check_gcs_credentials,
    check_input,
    check_labels,
    check_runner_reaches_paths,
    claim_output_folder,
    workers_in_launcher,
)
from beam_pipeline.cli.faults import AFTER, GRAPH, RUNNING, STARTING, RunEnd, fault_of, has_our_frames
from beam_pipeline.cli.local_runner import in_process, local_defaults, writers_prestarted
from beam_pipeline.cli.options import ConvertOptions, UserError, route_labels_flag, validate
from beam_pipeline.cli.outcome import final_lines
from beam_pipeline.cli.progress import JOB_MESSAGES_LOGGER, JobWatch, ProgressReporter
from beam_pipeline.cli.progress import end_line as end_progress_line
from beam_pipeline.cli.startup import LOCAL_RUNNERS
from beam_pipeline.pipeline import build_pipeline
from transforms import progress
from transforms.output.fence import Fence
from transforms.output.publish import SUMMARY_FILE, aborted_reason, temp_dir_for
from transforms.paths import normalize_root
from transforms.writing.files import delete_paths, read_file

# Exit statuses (documented in README.md).
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_TOO_MANY_FAILURES = 0, 1, 2, 3
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


# Logs "Created job with id: [...]" (read by schedulers) when a Dataflow job is submitted, and
# the job's messages while the launcher waits (cli/progress.py JobWatch counts them).
DATAFLOW_SUBMIT_LOGGER = JOB_MESSAGES_LOGGER


class TooManyFailures(Exception):
    """More images failed than --max_failure_ratio allows; failures.jsonl was written."""


def _not_a_fault(record: logging.LogRecord, remote: bool = False) -> bool:
    """A logging filter: False for records about a fault the run's last line reports (its
    message or exception: cli/faults.py `fault_of`) and, from a `remote` job, for the job's
    own tracebacks that pass through no code of ours (the job failed: its workers died)."""
    error = record.exc_info[1] if record.exc_info else None
    text = record.getMessage()
    if remote and "Traceback (most recent call last)" in text and not has_our_frames(text):
        return False
    return fault_of(RuntimeError(text)) is None and (error is None or fault_of(error) is None)


@contextlib.contextmanager
def quiet_faults(remote: bool = False):
    """While in the block, log records about a fault the user can act on are not printed:
    Beam logs a stage's USER_ERROR_MARKER error, a full disk or a store that gave up with its
    traceback before the runner re-raises it, and a remote job's failure as a job message;
    run() reports each in one line (exit 2). The filter sits on every handler of the root
    logger and on logging's last resort.
    """
    handlers = _root_handlers()
    quiet = functools.partial(_not_a_fault, remote=remote)
    for handler in handlers:
        handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(quiet)


def _root_handlers() -> list[logging.Handler]:
    return [h for h in (*logging.getLogger().handlers, logging.lastResort) if h is not None]


@contextlib.contextmanager
def held_logs(hold: bool = True):
    """While in the block (a remote runner starting the job), log records and the tracebacks of
    exceptions in threads (a job service's gRPC channels closing) are held: printed when it
    ends well; dropped when it raises, as the run's last line then says why the job could not
    start (before that, Beam warns about each download it tries, a dozen lines)."""
    if not hold:
        yield
        return
    held: list[tuple[logging.Handler, logging.LogRecord]] = []
    in_threads: list = []
    handlers, excepthook = _root_handlers(), threading.excepthook

    def hold_record(handler: logging.Handler, record: logging.LogRecord) -> bool:
        if record.name.startswith(DATAFLOW_SUBMIT_LOGGER):  # the job id: schedulers read it at once
            return True
        held.append((handler, record))
        return False

    filters = [functools.partial(hold_record, h) for h in handlers]
    for handler, keep in zip(handlers, filters, strict=True):
        handler.addFilter(keep)
    threading.excepthook = in_threads.append
    try:
        yield
    finally:
        threading.excepthook = excepthook
        for handler, keep in zip(handlers, filters, strict=True):
            handler.removeFilter(keep)
    for handler, record in held:
        handler.handle(record)
    for args in in_threads:
        excepthook(args)


_View = TypeVar("_View", bound=PipelineOptions)


class RunOptions(PipelineOptions):
    """The run's PipelineOptions, whose views are made once per options class.

    Beam asks for a view at every step it applies and every type check (~460 a graph), each
    a new argparse parser parsing the command line again (benchmarks/README.md "Start-up").
    All views of one PipelineOptions share its values, so a view made once answers every
    later call alike. The cache stays out of copies and pickles (Beam deep-copies the
    options into the Pipeline): each copy makes its own views of its own values.
    """

    def view_as(self, cls: type[_View]) -> _View:
        views = self.__dict__.setdefault("_views", {})
        if cls not in views:
            views[cls] = super().view_as(cls)
        return views[cls]

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        state.pop("_views", None)
        return state


def run(
    argv: list[str] | None = None,
    save_main_session: bool = True,
    *,
    on_result: Callable[[PipelineResult], None] | None = None,
    graph_seams: dict | None = None,
) -> dict:
    """Runs one conversion and returns its summary (the content of summary.json).

    `on_result` (tests, benchmarks): called with Beam's PipelineResult once the job finished.
    `graph_seams` (benchmarks): build_pipeline's keywords.

    Whatever stops it, the run ends in cli/faults.py: a fault the user can act on (a store
    that does not answer, no space left, a runner that cannot start, a job that failed) is a
    UserError of one line, and the output folder's claim is ended as the fault allows.

    Raises:
      UserError: bad options, missing input, unwritable or occupied output, a fault above.
      TooManyFailures: more than --max_failure_ratio of the images failed.
    """
    argv = route_labels_flag(list(sys.argv[1:] if argv is None else argv))
    check_args(argv)
    options = RunOptions(argv)
    opts = options.view_as(ConvertOptions)
    validate(opts)
    output_dir = normalize_root(opts.output_dir)
    runner = options.view_as(StandardOptions).runner
    end = RunEnd(output_dir, runner, local=runner in LOCAL_RUNNERS, in_launcher=workers_in_launcher(options))
    try:
        check_runner_reaches_paths(options, opts)  # before credentials, claim or graph
        check_gcs_credentials([opts.input, opts.output_dir, opts.labels_path, opts.label_map])
        check_input(normalize_root(opts.input))
        check_labels(opts)
        # A job outside this process runs on after the launcher is gone: it keeps the claim
        # (transforms/output/fence.py); one in it (or in workers that live in it) does not.
        end.claim = claim_output_folder(
            output_dir, opts.overwrite, uuid.uuid4().hex, end.job_outlives_launcher
        )
        summary = _run_claimed(options, argv, save_main_session, end, on_result, graph_seams)
    except TooManyFailures:  # stopped on purpose, the job over: a marker left stays, its lease ended
        end.finish(over=True)
        raise
    except BaseException as error:
        line = end.stop(error)
        if line is None:
            raise
        raise UserError(line) from None
    end.finish()
    return summary


def _run_claimed(
    options: PipelineOptions,
    argv: list[str],
    save_main_session: bool,
    end: RunEnd,
    on_result: Callable[[PipelineResult], None] | None = None,
    graph_seams: dict | None = None,
) -> dict:
    """The conversion itself, in an output folder claimed by `end.claim` (see run())."""
    opts = options.view_as(ConvertOptions)
    claim = end.claim
    output_dir, run_id = claim.output_dir, claim.run_id
    options.view_as(SetupOptions).save_main_session = save_main_session
    local_defaults(options, argv)

    end.stage = STARTING
    try:
        p = beam.Pipeline(options=options)
    except ValueError as e:  # Beam's own option checks (project id, endpoints, locations)
        raise UserError(" ".join(str(e).replace("Pipeline has validations errors:", "").split())) from None
    end.stage = GRAPH
    build_pipeline(p, opts, run_id, fence=Fence.of(claim), **(graph_seams or {}))
    reporter, watch = None, contextlib.nullcontext()
    if in_process(options):
        if not opts.quiet:
            reporter = ProgressReporter(progress.register(run_id), sys.stderr, opts.progress_interval)
            reporter.start()
    writers = writers_prestarted() if in_process(options) else contextlib.nullcontext()
    try:
        with writers, quiet_faults(remote=not end.local):
            end.stage = RUNNING if end.local else STARTING  # (the local runner runs it all in p.run())
            with held_logs(not end.local):
                result = end.result = p.run()
            end.stage = RUNNING
            if not end.local:
                dataflow = "dataflow" in str(end.runner).lower()  # (its client is not for two threads)
                watch = JobWatch(result, temp_dir_for(output_dir, run_id), sys.stderr, ask_state=not dataflow)
            with watch:
                result.wait_until_finish()
            if on_result is not None:
                on_result(result)
        end.stage = AFTER
        if options.view_as(TestOptions).dry_run:  # Dataflow: the job described, not run
            end.claim.abandon()
            end.claim = None
            return {"described_only": True, "output_dir": output_dir}
    finally:
        if reporter is not None:
            reporter.stop()
        progress.unregister(run_id)
    reason = aborted_reason(output_dir, run_id)
    if reason:
        delete_paths([temp_dir_for(output_dir, run_id)])
        raise TooManyFailures(reason)
    try:
        return json.loads(read_file(FileSystems.join(output_dir, SUMMARY_FILE)).decode("utf-8"))
    except OSError as e:
        if fault_of(e) is not None:  # the store gave up: not a missing file
            raise
        raise UserError(f"the job finished without writing {SUMMARY_FILE}") from None


def _convert(argv: list[str]) -> int:
    everything = "--help_all" in argv  # help anywhere among the flags: help, and nothing run
    if everything or "-h" in argv or "--help" in argv:
        print(cli_help.convert_help(cli_help.prog_name(), everything), end="")
        return EXIT_OK
    summary = run(argv)
    if summary.get("described_only"):
        print("img2tfrecord: job described, not run (dry run)", file=sys.stderr)
    else:
        print("\n".join(final_lines(summary)), file=sys.stderr)
    return EXIT_OK


def _demo(argv: list[str]) -> int:
    from beam_pipeline import demo

    return demo.main(argv, run)


def _read_back(argv: list[str], reader: str) -> int:
    """verify and inspect (beam_pipeline/readers/), without TensorFlow's C++ start-up lines
    (the oneDNN notice ignores TF_CPP_MIN_LOG_LEVEL, so its custom ops are off: they change
    nothing in parsing and decoding). Either variable set by the user wins.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    check_gcs_credentials([a.partition("=")[2] or a for a in argv])
    return importlib.import_module(f"beam_pipeline.readers.{reader}").main(argv)


COMMANDS = {
    "convert": _convert,
    "demo": _demo,
    "verify": functools.partial(_read_back, reader="verify"),
    "inspect": functools.partial(_read_back, reader="inspect"),
}


def main(argv: list[str] | None = None) -> int:
    """The CLI. `convert` is the default command, so schedulers may pass flags only."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger(DATAFLOW_SUBMIT_LOGGER).setLevel(logging.INFO)
    prog = cli_help.prog_name()
    if not argv:  # the verb list, and exit 2
        print(cli_help.top_help(prog), end="", file=sys.stderr)
        print(f"{prog}: error: no command given (try `{prog} demo`)", file=sys.stderr)
        return EXIT_USAGE
    if argv[0] in ("-h", "--help", "help"):
        print(cli_help.top_help(prog), end="")
        return EXIT_OK
    if argv[0] == "--version":
        print(f"img2tfrecord {cli_help.version()}")
        return EXIT_OK
    command = argv.pop(0) if not argv[0].startswith("-") else "convert"
    try:
        if command not in COMMANDS:
            hint = did_you_mean(command, COMMANDS)
            raise UserError(
                f"unknown command {command!r}{': ' + hint if hint else ''} (one of {', '.join(COMMANDS)})"
            )
        return COMMANDS[command](argv)
    except (UserError, TooManyFailures) as e:
        print(f"img2tfrecord: error: {e}", file=sys.stderr)
        return EXIT_TOO_MANY_FAILURES if isinstance(e, TooManyFailures) else EXIT_USAGE


def _exit_on_interrupt(cli_pid: int, signum: int, frame: object) -> None:
    """Ctrl-C: one line instead of the runner's tracebacks, then the exit a kill would give.
    Safe: an unfinished output is replaced by the next run, as after a SIGKILL
    (tests/output/test_reliability_output.py). Forked shard writers exit silently.
    """
    if os.getpid() == cli_pid:
        end_progress_line(sys.stderr)  # the message goes below the bar, not onto it
        print(
            "img2tfrecord: interrupted; rerun to start over (the unfinished local output is "
            "replaced; a Dataflow job already submitted keeps running)",
            file=sys.stderr,
            flush=True,
        )
    os._exit(EXIT_INTERRUPTED)


def cli() -> None:
    """The CLI's process (beam_pipeline/__main__.py): main(), then exit. Ctrl-C is handled
    here, not in main(), which tests and callers run in a long-lived process."""
    signal.signal(signal.SIGINT, functools.partial(_exit_on_interrupt, os.getpid()))
    sys.exit(main())
