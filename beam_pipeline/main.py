"""Entry points: `img2tfrecord <command>` / `python -m beam_pipeline <command>`.

`run(argv)` runs a conversion and returns its summary; `main(argv)` is the CLI, which turns
user errors into one line on stderr and an exit status.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
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

from beam_pipeline.cli import preflight
from beam_pipeline.cli.checks import (
    check_all_would_fail,
    check_input,
    check_labels,
    check_runner_reaches_paths,
    claim_output_folder,
)
from beam_pipeline.cli.local_runner import in_process, local_defaults, writers_prestarted
from beam_pipeline.cli.options import (
    ConvertOptions,
    UserError,
    check_args,
    route_labels_flag,
    validate,
)
from beam_pipeline.cli.progress import ProgressReporter
from beam_pipeline.cli.progress import end_line as end_progress_line
from beam_pipeline.cli.runners import LOCAL_RUNNERS
from beam_pipeline.pipeline import build_pipeline
from transforms import gcs, progress
from transforms.failures import user_error_text
from transforms.output.fence import Claim, Fence
from transforms.output.publish import FAILURES_FILE, SUMMARY_FILE, aborted_reason, temp_dir_for
from transforms.paths import normalize_root
from transforms.writing.files import delete_paths

# Exit statuses (documented in README.md).
EXIT_OK = 0


EXIT_FAILED = 1


EXIT_USAGE = 2


EXIT_TOO_MANY_FAILURES = 3


EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


# Logs "Created job with id: [...]" when a Dataflow job is submitted.
DATAFLOW_SUBMIT_LOGGER = "apache_beam.runners.dataflow"


class TooManyFailures(Exception):
    """More images failed than --max_failure_ratio allows; failures.jsonl was written."""


class _UserErrorFilter(logging.Filter):
    """Drops log records about a user error (USER_ERROR_MARKER in the message or exception)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return user_error_text(record.getMessage()) is None and (
            error is None or user_error_text(str(error)) is None
        )


@contextlib.contextmanager
def quiet_user_errors():
    """While in the block, log records about a user error are not printed.

    A stage that finds the user's mistake (a broken labels table, an input folder that
    cannot be listed) raises an error marked with USER_ERROR_MARKER (transforms/failures.py);
    Beam logs it with its traceback (ERROR, apache_beam.runners.common) before the runner
    re-raises it, and run() then reports it as one line (exit 2). The filter sits on
    every handler of the root logger and on logging's last-resort handler, so it holds
    whatever logging the caller set up; other records pass untouched.
    """
    quiet = _UserErrorFilter()
    handlers = [*logging.getLogger().handlers, logging.lastResort]
    for handler in handlers:
        if handler is not None:
            handler.addFilter(quiet)
    try:
        yield
    finally:
        for handler in handlers:
            if handler is not None:
                handler.removeFilter(quiet)


_View = TypeVar("_View", bound=PipelineOptions)


class RunOptions(PipelineOptions):
    """The run's PipelineOptions, whose views are made once per options class.

    Beam asks the pipeline's options for a view (`view_as`) at every step it applies and
    at every type check: ~460 times for this graph, each building an argparse parser and
    parsing the command line again (~0.4 ms each, ~0.18 s of CPU a run before the first
    image). All views of one PipelineOptions share its option values (`_all_options`), so
    a view made once answers every later call alike: a set value is seen through every view
    as before. The cache stays out of copies and pickles (Beam deep-copies the options into
    the Pipeline): each copy makes its own views of its own values.
    """

    def view_as(self, cls: type[_View]) -> _View:
        views = self.__dict__.get("_views")
        if views is None:
            views = self.__dict__["_views"] = {}
        view = views.get(cls)
        if view is None:
            view = views[cls] = super().view_as(cls)
        return view

    def __getstate__(self) -> dict:
        state = dict(super().__getstate__())
        state.pop("_views", None)
        return state


def _described_only(options: PipelineOptions) -> bool:
    """A Dataflow dry run: the job is described, not run (classic templates are refused by
    check_runner_reaches_paths)."""
    return bool(options.view_as(TestOptions).dry_run)


def run(
    argv: list[str] | None = None,
    save_main_session: bool = True,
    *,
    on_result: Callable[[PipelineResult], None] | None = None,
    graph_seams: dict | None = None,
) -> dict:
    """Runs one conversion and returns its summary (the content of summary.json).

    `on_result` (for tests and benchmarks) is called with Beam's PipelineResult once the
    job has finished, e.g. to read its metrics (the group sizes of batching.group_size).
    `graph_seams` (benchmarks) are keyword arguments of build_pipeline (list_files, reader).

    Raises:
      UserError: bad options, missing input, unwritable or occupied output.
      TooManyFailures: more than --max_failure_ratio of the images failed.
    """
    argv = route_labels_flag(list(sys.argv[1:] if argv is None else argv))
    check_args(argv)
    options = RunOptions(argv)
    opts = options.view_as(ConvertOptions)
    validate(opts)
    check_runner_reaches_paths(options, opts)  # before credentials, claim or graph
    preflight.check_gcs_credentials([opts.input, opts.output_dir, opts.labels_path, opts.label_map])
    check_input(normalize_root(opts.input))
    if opts.labels_path:
        check_labels(opts)
    check_all_would_fail(opts)
    output_dir = normalize_root(opts.output_dir)
    run_id = uuid.uuid4().hex
    # A runner outside this process runs the job on after the launcher is gone: the job keeps
    # the claim (transforms/output/fence.py).
    job = options.view_as(StandardOptions).runner not in LOCAL_RUNNERS
    claim = claim_output_folder(output_dir, opts.overwrite, run_id, job)
    try:
        return _run_claimed(options, argv, save_main_session, claim, on_result, graph_seams)
    finally:
        claim.release()


def _run_claimed(
    options: PipelineOptions,
    argv: list[str],
    save_main_session: bool,
    claim: Claim,
    on_result: Callable[[PipelineResult], None] | None = None,
    graph_seams: dict | None = None,
) -> dict:
    """The conversion itself, in an output folder claimed by `claim` (see run())."""
    opts = options.view_as(ConvertOptions)
    output_dir, run_id = claim.output_dir, claim.run_id
    options.view_as(SetupOptions).save_main_session = save_main_session
    local_defaults(options, argv)

    try:
        p = beam.Pipeline(options=options)
    except ValueError as e:  # Beam's own option checks (project id, endpoints, locations)
        claim.release(abandon=True)
        raise UserError(" ".join(str(e).replace("Pipeline has validations errors:", "").split())) from None
    build_pipeline(p, opts, run_id, fence=Fence.of(claim), **(graph_seams or {}))
    reporter = None
    if not opts.quiet and in_process(options):
        reporter = ProgressReporter(progress.register(run_id), sys.stderr, opts.progress_interval).start()
    writers = writers_prestarted() if in_process(options) else contextlib.nullcontext()
    try:
        with writers, quiet_user_errors():
            result = p.run()
            result.wait_until_finish()
            if on_result is not None:
                on_result(result)
        if _described_only(options):
            claim.release(abandon=True)  # nothing ran here
            return {"described_only": True, "output_dir": output_dir}
    except Exception as e:
        # A user error found inside the pipeline (e.g. nothing to convert) arrives
        # wrapped by the runner; anything else is a bug and propagates.
        text = user_error_text(str(e))
        if text is None:
            raise
        claim.release(abandon=True)  # nothing was published: the folder is left as it was
        raise UserError(text) from None
    finally:
        if reporter is not None:
            reporter.stop()
        progress.unregister(run_id)
    reason = aborted_reason(output_dir, run_id)
    if reason:
        delete_paths([temp_dir_for(output_dir, run_id)])
        raise TooManyFailures(reason)
    summary_path = FileSystems.join(output_dir, SUMMARY_FILE)
    try:
        # (gs:// raises its own NotFound, not an OSError, on a missing object.)
        if not gcs.exists(summary_path):
            raise OSError(summary_path)
        with gcs.open_read(summary_path) as f:
            summary = json.loads(f.read().decode("utf-8"))
    except OSError:
        raise UserError(f"the job finished without writing {SUMMARY_FILE}") from None
    return summary


def _convert(argv: list[str]) -> int:
    if _help_asked(argv):
        return EXIT_OK
    summary = run(argv)
    if summary.get("described_only"):
        print("img2tfrecord: job described, not run (dry run)", file=sys.stderr)
        return EXIT_OK
    print(final_line(summary), file=sys.stderr)
    return EXIT_OK


def final_line(summary: dict) -> str:
    """convert's last line: what was written, with thousands separators as the progress bar."""
    failed = summary["failed"]
    where = f"{failed:,} failed, see {FAILURES_FILE}" if failed else "none failed"
    return f"img2tfrecord: wrote {summary['written']:,} of {summary['listed']:,} images ({where})"


def _demo(argv: list[str]) -> int:
    from beam_pipeline import demo

    return demo.main(argv, run)


def quiet_tensorflow() -> None:
    """Silences TensorFlow's C++ start-up log lines for verify and inspect (set before TF loads).

    TF_CPP_MIN_LOG_LEVEL=2 drops its INFO and WARNING lines; the oneDNN notice ignores it, so
    oneDNN's custom ops are off too (TF_ENABLE_ONEDNN_OPTS=0): these commands parse records
    and decode images, where they change nothing. Either variable set by the user wins.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def _verify(argv: list[str]) -> int:
    quiet_tensorflow()
    preflight.check_gcs_credentials([a.partition("=")[2] or a for a in argv])
    from beam_pipeline.readers import verify

    return verify.main(argv)


def _inspect(argv: list[str]) -> int:
    quiet_tensorflow()
    preflight.check_gcs_credentials([a.partition("=")[2] or a for a in argv])
    from beam_pipeline.readers import inspect as inspection

    return inspection.main(argv)


COMMANDS = {"convert": _convert, "demo": _demo, "verify": _verify, "inspect": _inspect}


def _help_asked(argv: list[str]) -> bool:
    """Prints convert's help (`-h`, `--help`), or all of it with Beam's options (`--help_all`)."""
    from beam_pipeline.cli import help as cli_help

    everything = "--help_all" in argv
    if everything or "-h" in argv or "--help" in argv:
        print(cli_help.convert_help(cli_help.prog_name(), everything), end="")
        return True
    return False


def _top_level(argv: list[str]) -> int | None:
    """The verb list (`--help`, or no arguments: exit 2) and `--version`; None for a command."""
    from beam_pipeline.cli import help as cli_help

    prog = cli_help.prog_name()
    if not argv:
        print(cli_help.top_help(prog), end="", file=sys.stderr)
        print(f"{prog}: error: no command given (try `{prog} demo`)", file=sys.stderr)
        return EXIT_USAGE
    if argv[0] in ("-h", "--help", "help"):
        print(cli_help.top_help(prog), end="")
        return EXIT_OK
    if argv[0] == "--version":
        print(f"img2tfrecord {cli_help.version()}")
        return EXIT_OK
    return None


def main(argv: list[str] | None = None) -> int:
    """The CLI. `convert` is the default command, so schedulers may pass flags only."""
    argv = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Dataflow submissions log the job id and console URL at INFO; schedulers (Airflow's
    # Dataflow hook) read the job id from the line "Created job with id: [...]".
    logging.getLogger(DATAFLOW_SUBMIT_LOGGER).setLevel(logging.INFO)
    status = _top_level(argv)
    if status is not None:
        return status
    command = "convert"
    if argv and not argv[0].startswith("-"):
        command = argv.pop(0)
    if command not in COMMANDS:
        print(
            f"img2tfrecord: error: unknown command {command!r} (one of {', '.join(COMMANDS)})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        return COMMANDS[command](argv)
    except UserError as e:
        print(f"img2tfrecord: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except TooManyFailures as e:
        print(f"img2tfrecord: error: {e}", file=sys.stderr)
        return EXIT_TOO_MANY_FAILURES


def _exit_on_interrupt(signum: int, frame: object) -> None:
    """Ctrl-C: one line instead of the runner's tracebacks, then the exit a kill would give.

    Stopping at once is safe: a run's output stays marked unfinished until its last file is
    published (transforms/output/publish.py), and the next run into the folder replaces it, as
    after a SIGKILL (tests/output/test_reliability_output.py). Forked shard writers, which get
    the terminal's SIGINT too, exit silently.
    """
    if os.getpid() == _CLI_PID:
        end_progress_line(sys.stderr)  # the message goes below the bar, not onto it
        print(
            "img2tfrecord: interrupted; rerun to start over (the unfinished local output is "
            "replaced; a Dataflow job already submitted keeps running)",
            file=sys.stderr,
            flush=True,
        )
    os._exit(EXIT_INTERRUPTED)


_CLI_PID = 0  # the process that runs cli()


def cli() -> None:
    """The CLI's process (beam_pipeline/__main__.py, after cli/startup.py): main(), then exit.

    Only here, not in main(), which tests and callers run in a long-lived process: Ctrl-C
    handling (`_exit_on_interrupt`).
    """
    global _CLI_PID
    _CLI_PID = os.getpid()
    signal.signal(signal.SIGINT, _exit_on_interrupt)
    sys.exit(main())
