"""Start-up costs of ours: the options' views made once, one OpenBLAS thread in the CLI, Beam's
imports of IOs that a local run never uses left out; the collector's settings of a run."""

from __future__ import annotations

import argparse
import copy
import gc
import os
import pickle
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TypeOptions

from beam_pipeline import runner_named, started_as_cli
from beam_pipeline.cli.options import ConvertOptions
from beam_pipeline.main import RUN_GC_THRESHOLD0, RunOptions, collection_for_run, run
from beam_pipeline.pipeline import build_pipeline
from tests.conftest import read_records

ARGV = ["--input", "/in", "--output_dir", "/out", "--runner", "FnApiRunner"]


def test_run_options_make_one_view_per_class_sharing_the_values():
    options = RunOptions(ARGV)
    view = options.view_as(ConvertOptions)
    assert options.view_as(ConvertOptions) is view
    assert view.input == "/in"
    view.seed = 7  # set through the cached view: seen through any other view, as in Beam
    assert options.view_as(ConvertOptions).seed == 7
    assert PipelineOptions.view_as(options, ConvertOptions).seed == 7
    options.view_as(StandardOptions).runner = "X"
    assert options.get_all_options()["runner"] == "X"


def test_run_options_copies_and_pickles_carry_values_not_views():
    options = RunOptions(ARGV)
    original = options.view_as(ConvertOptions)
    for clone in (copy.deepcopy(options), pickle.loads(pickle.dumps(options))):
        assert type(clone) is RunOptions
        assert "_views" not in clone.__dict__
        view = clone.view_as(ConvertOptions)
        assert view is not original and view.output_dir == "/out"
        view.output_dir = "/elsewhere"  # the copy's own values
        assert original.output_dir == "/out"
        assert clone.view_as(ConvertOptions).output_dir == "/elsewhere"
    assert clone.get_all_options()["input"] == options.get_all_options()["input"]


def _parsers_built(options: PipelineOptions, monkeypatch) -> int:
    """argparse parsers made while the conversion's graph is built on `options`."""
    built = []
    init = argparse.ArgumentParser.__init__

    def counting(self, *args, **kwargs):
        built.append(1)
        init(self, *args, **kwargs)

    monkeypatch.setattr(argparse.ArgumentParser, "__init__", counting)
    p = beam.Pipeline(options=options)
    build_pipeline(p, options.view_as(ConvertOptions), "run")
    p.to_runner_api()
    monkeypatch.setattr(argparse.ArgumentParser, "__init__", init)
    return len(built)


def test_building_the_graph_parses_the_options_a_few_times_not_at_every_step(monkeypatch):
    # Beam asks for a view at every applied step and type check; each plain view parses the
    # command line again. With RunOptions the count no longer grows with the graph.
    plain = _parsers_built(PipelineOptions(ARGV), monkeypatch)
    cached = _parsers_built(RunOptions(ARGV), monkeypatch)
    assert plain > 200
    assert cached < 40
    assert RunOptions(ARGV).view_as(TypeOptions).pipeline_type_check  # Beam's checks still on


@pytest.mark.parametrize(
    "argv, cli",
    [
        (["/usr/bin/python3", "-m", "beam_pipeline", "convert", "--input", "x"], True),
        (["python", "-X", "importtime", "-m", "beam_pipeline"], True),
        (["/venv/bin/python", "/venv/bin/img2tfrecord", "convert"], True),
        (["python", "-m", "pytest", "tests"], False),
        (["python", "train.py", "-m", "beam_pipeline"], False),
        (["python", "-c", "import beam_pipeline"], False),
        (["python"], False),
    ],
)
def test_started_as_cli(argv, cli):
    assert started_as_cli(argv) is cli


def _after_import(orig_argv: list[str] | None) -> tuple[str, int]:
    """(OPENBLAS_NUM_THREADS, threads of the process) once the package is imported by a
    fresh interpreter whose command line was `orig_argv` (None: a plain program)."""
    code = (
        (f"import sys; sys.orig_argv = {orig_argv!r}\n" if orig_argv else "")
        + "import os, beam_pipeline\n"
        + "print(os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    value, threads = out.stdout.split()
    return value, int(threads)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc")
def test_only_the_cli_asks_openblas_for_one_thread():
    value, threads = _after_import(["python", "-m", "beam_pipeline", "convert"])
    assert value == "1"
    plain_value, plain_threads = _after_import(None)  # a program importing the package: untouched
    assert plain_value == "None"
    if os.cpu_count() > 1:  # OpenBLAS's pool: one thread per core but the caller's
        assert threads < plain_threads


# A process that has started gRPC forks children with `subprocess` (what the local runner's
# multi_processing mode does for its workers, and what tests do for CLIs).
_FORKS_AFTER_GRPC = """
import subprocess
from concurrent import futures

import beam_pipeline
import grpc

server = grpc.server(futures.ThreadPoolExecutor(2))
server.add_insecure_port("localhost:0")
server.start()
channel = grpc.insecure_channel("localhost:1")
children = [
    subprocess.run(["true"], preexec_fn=lambda: None, capture_output=True) for _ in range({spawns})
]
print(sum(child.returncode != 0 for child in children))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gRPC's epoll poller")
def test_the_cli_process_forks_children_that_grpc_never_aborts():
    # With gRPC's fork handlers on, 3-12 children in 1,000 died of SIGABRT before running.
    code = 'import sys; sys.orig_argv = ["python", "-m", "beam_pipeline", "convert"]\n'
    code += _FORKS_AFTER_GRPC.format(spawns=1500)
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["0"], out.stderr[-2000:]


_LOADED = """
import sys
{set_argv}import beam_pipeline
skipped = [name for name in beam_pipeline.SKIPPED_BY_LOCAL_RUNS if name in sys.modules]
print(" ".join(skipped) or "-")
from apache_beam.utils import retry  # what a local run does use: gs:// and its retries
print(retry.HttpError is not None, retry.GoogleAPICallError is not None, "apache_beam.io.gcp.gcsio" in sys.modules)
import pymongo, google.cloud.bigquery  # afterwards they import as usual
print(pymongo.__name__, google.cloud.bigquery.__name__)
"""


def _loaded_with(orig_argv: list[str] | None) -> tuple[list[str], str]:
    """(Lines printed, stderr) of a fresh interpreter that imports the package with `orig_argv`."""
    set_argv = f"sys.orig_argv = {orig_argv!r}\n" if orig_argv else ""
    code = _LOADED.format(set_argv=set_argv)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.splitlines(), out.stderr


@pytest.mark.parametrize(
    "argv, runner",
    [
        (["--input", "x"], None),
        (["--runner", "DataflowRunner", "--input", "x"], "DataflowRunner"),
        (["--runner=direct", "--runner", "FnApiRunner"], "FnApiRunner"),
        (["--runner"], None),
    ],
)
def test_runner_named(argv, runner):
    assert runner_named(argv) == runner


def test_a_local_cli_run_leaves_out_beams_unused_imports_and_they_still_import_later():
    lines, stderr = _loaded_with(["python", "-m", "beam_pipeline", "convert", "--input", "x"])
    assert lines == ["-", "True True True", "pymongo google.cloud.bigquery"]
    assert "bson" not in stderr  # Beam's "Could not find a compatible bson package" muted
    assert stderr == ""


@pytest.mark.parametrize(
    "orig_argv",
    [None, ["python", "-m", "beam_pipeline", "convert", "--runner", "DataflowRunner", "--input", "x"]],
)
def test_programs_and_other_runners_import_beam_whole(orig_argv):
    lines, _ = _loaded_with(orig_argv)
    assert lines[1] == "True True True"
    assert set(lines[0].split()) >= {"pymongo", "bson", "google.cloud.bigquery", "google.cloud.dataflow"}


def test_the_cli_converts_with_the_imports_left_out(image_tree, tmp_path):
    # The default run in a fresh CLI process: the same records as an in-process run.
    cli_out, lib_out = tmp_path / "cli", tmp_path / "lib"
    argv = ["--input", str(image_tree), "--write_processes", "1"]
    done = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "beam_pipeline",
            "convert",
            *argv,
            "--output_dir",
            str(cli_out),
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")
    }
    assert not imported & {"pymongo.errors", "google.cloud.bigquery.client", "pyarrow.lib"}
    run([*argv, "--output_dir", str(lib_out)], save_main_session=False)
    cli_records, lib_records = read_records(cli_out), read_records(lib_out)
    assert cli_records and cli_records == lib_records
    for shard in sorted(cli_out.glob("*.tfrecord*")):
        assert shard.read_bytes() == (lib_out / shard.name).read_bytes()


def test_a_program_importing_the_package_keeps_its_collector_settings():
    # Importing freezes what Beam's import made, nothing else: thresholds and on/off as set.
    code = (
        "import gc\n"
        "gc.set_threshold(1234, 5, 6)\n"
        "import beam_pipeline, beam_pipeline.main\n"
        "print(gc.get_threshold(), gc.isenabled())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[0] == "(1234, 5, 6) True"


def test_a_conversion_runs_frozen_with_a_large_young_generation_and_puts_both_back(image_tree, tmp_path):
    seen = []

    def during(result):  # called by run() once the job has finished, still inside the run
        seen.append((gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()))

    saved = gc.get_threshold()
    gc.set_threshold(1234, 5, 6)
    try:
        run(
            ["--input", str(image_tree), "--output_dir", str(tmp_path / "out")],
            save_main_session=False,
            on_result=during,
        )
        assert gc.get_threshold() == (1234, 5, 6)
        assert gc.get_freeze_count() == 0  # unfrozen: repeated runs in a program free their graphs
    finally:
        gc.set_threshold(*saved)
    ((thresholds, frozen, enabled),) = seen
    assert thresholds == (RUN_GC_THRESHOLD0, 5, 6)
    assert frozen > 100_000  # Beam's modules and the graph
    assert enabled
    assert read_records(tmp_path / "out")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_processes_forked_during_a_conversion_collect_as_before_it():
    # The shard writers are forked while a run's thresholds are set: they get the ones from before.
    saved = gc.get_threshold()
    gc.set_threshold(1234, 5, 6)
    try:
        with collection_for_run():
            assert gc.get_threshold() == (RUN_GC_THRESHOLD0, 5, 6)
            read, write = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child
                os.write(write, repr(gc.get_threshold()).encode())
                os._exit(0)
            os.close(write)
            child = os.read(read, 100).decode()
            os.close(read)
            os.waitpid(pid, 0)
            assert gc.get_threshold() == (RUN_GC_THRESHOLD0, 5, 6)  # the parent keeps the run's
        assert child == "(1234, 5, 6)"
        assert gc.get_threshold() == (1234, 5, 6)
    finally:
        gc.set_threshold(*saved)


def test_runs_that_overlap_put_back_the_thresholds_from_before_the_first():
    # Two conversions in threads of one program: the first ends while the second runs.
    saved = gc.get_threshold()
    gc.set_threshold(1234, 5, 6)
    try:
        first, second = collection_for_run(), collection_for_run()
        first.__enter__()
        second.__enter__()
        first.__exit__(None, None, None)
        assert gc.get_threshold() == (RUN_GC_THRESHOLD0, 5, 6)  # the second still runs
        second.__exit__(None, None, None)
        assert gc.get_threshold() == (1234, 5, 6)
        assert gc.get_freeze_count() == 0
    finally:
        gc.set_threshold(*saved)
