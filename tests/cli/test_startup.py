"""Start-up: the options' views made once; the CLI's process set-up (cli/startup.py: gRPC's fork
support off, Beam's imports of IOs that a local run never uses left out), and nothing of it, nor
any other process-wide state, changed by importing the package."""

from __future__ import annotations

import argparse
import copy
import os
import pickle
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TypeOptions

from beam_pipeline.cli import startup
from beam_pipeline.cli.options import ConvertOptions
from beam_pipeline.cli.startup import runner_named
from beam_pipeline.main import RunOptions, run
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


# A process that has started gRPC forks children with `subprocess` (what the local runner's
# multi_processing mode does for its workers, and what tests do for CLIs).
_FORKS_AFTER_GRPC = """
import subprocess
from concurrent import futures

{prepare}import grpc

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
    code = _FORKS_AFTER_GRPC.format(spawns=1500, prepare=_PREPARE.format(argv=["convert"]))
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split() == ["0"], out.stderr[-2000:]


_PREPARE = "from beam_pipeline.cli import startup\nstartup.prepare({argv!r})\n"

_LOADED = """
import sys
{prepare}import beam_pipeline.main
from beam_pipeline.cli import startup
skipped = [name for name in startup.SKIPPED_BY_LOCAL_RUNS if name in sys.modules]
print(" ".join(skipped) or "-")
from apache_beam.utils import retry  # what a local run does use: gs:// and its retries
print(retry.HttpError is not None, retry.GoogleAPICallError is not None, "apache_beam.io.gcp.gcsio" in sys.modules)
import pymongo, google.cloud.bigquery  # afterwards they import as usual
print(pymongo.__name__, google.cloud.bigquery.__name__)
"""


def _loaded_with(argv: list[str] | None) -> tuple[list[str], str]:
    """(Lines printed, stderr) of a fresh interpreter that imports the CLI after the CLI's set-up
    for `argv` (None: none, as a program that imports the package)."""
    code = _LOADED.format(prepare=_PREPARE.format(argv=argv) if argv is not None else "")
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
    lines, stderr = _loaded_with(["convert", "--input", "x"])
    assert lines == ["-", "True True True", "pymongo google.cloud.bigquery"]
    assert "bson" not in stderr  # Beam's "Could not find a compatible bson package" muted
    assert stderr == ""


@pytest.mark.parametrize(
    "argv",
    [None, ["convert", "--runner", "DataflowRunner", "--input", "x"]],
)
def test_programs_and_other_runners_import_beam_whole(argv):
    lines, _ = _loaded_with(argv)
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
    assert not imported & {"pymongo.errors", "google.cloud.bigquery.client"}
    run([*argv, "--output_dir", str(lib_out)], save_main_session=False)
    cli_records, lib_records = read_records(cli_out), read_records(lib_out)
    assert cli_records and cli_records == lib_records
    for shard in sorted(cli_out.glob("*.tfrecord*")):
        assert shard.read_bytes() == (lib_out / shard.name).read_bytes()


def test_the_skipped_imports_were_checked_against_this_beam():
    # SKIPPED_BY_LOCAL_RUNS relies on which of its imports Beam guards with `except ImportError`:
    # a new Beam may import one of them unguarded (the CLI would then fail to start) or add
    # others. Read apache_beam's imports of each again, then update BEAM_CHECKED.
    assert beam.__version__ == startup.BEAM_CHECKED, (
        f"Beam {beam.__version__}: check beam_pipeline/cli/startup.py SKIPPED_BY_LOCAL_RUNS "
        f"against it (checked with {startup.BEAM_CHECKED})"
    )


# A fresh interpreter: the process-wide state before and after importing every module of ours.
_STATE = """
import gc, importlib, json, os, pkgutil, sys
import apache_beam
from apache_beam import coders
from apache_beam.runners.worker import statesampler

def state():
    return dict(
        gc=[gc.get_threshold(), gc.get_freeze_count(), gc.isenabled()],
        environ=dict(os.environ),
        sampler=repr(statesampler.StateSampler.__init__.__defaults__),
        handlers=[repr(h) for h in __import__("logging").getLogger().handlers],
    )

before, loaded = state(), set(sys.modules)
import beam_pipeline, transforms
ours = ["beam_pipeline"] + [
    m.name for p, pre in ((beam_pipeline, "beam_pipeline."), (transforms, "transforms."))
    for m in pkgutil.walk_packages(p.__path__, pre)
]
for name in ours:
    if name not in ("beam_pipeline.__main__",):
        importlib.import_module(name)
from transforms.records import ImageRecord
print(json.dumps(dict(
    before=before, after=state(), added=sorted(set(sys.modules) - loaded),
    record_coder=type(coders.registry.get_coder(ImageRecord)).__name__,
)))
"""


def _top_level_of_requirements() -> set[str]:
    """Top-level import names of img2tfrecord's requirements and theirs (not the extras')."""
    from importlib import metadata

    providers = metadata.packages_distributions()
    dists, todo = set(), ["img2tfrecord"]
    while todo:
        try:
            requires = metadata.requires(todo.pop()) or []
        except metadata.PackageNotFoundError:
            continue
        for req in requires:
            if "extra ==" in req:
                continue
            name = req.split(";")[0].split("[")[0].split()[0]
            for sep in "<>=!~":
                name = name.split(sep)[0]
            key = name.lower().replace("_", "-")
            if key not in dists:
                dists.add(key)
                todo.append(name)
    return {
        top for top, owners in providers.items() if any(o.lower().replace("_", "-") in dists for o in owners)
    }


def test_importing_the_package_changes_no_process_wide_state():
    # Collector settings and frozen objects, the environment, Beam's state-sampler defaults,
    # logging's handlers, Beam's coder registry; modules loaded beyond ours and our requirements'.
    import json

    env = {
        k: v for k, v in os.environ.items() if k not in ("GRPC_ENABLE_FORK_SUPPORT", "OPENBLAS_NUM_THREADS")
    }
    out = subprocess.run([sys.executable, "-c", _STATE], capture_output=True, text=True, env=env, check=True)
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["after"] == seen["before"]
    assert seen["record_coder"] != "ImageRecordCoder"  # registered where a pipeline is built
    allowed = _top_level_of_requirements() | set(sys.stdlib_module_names) | {"beam_pipeline", "transforms"}
    foreign = sorted(
        {m for m in seen["added"] if m.split(".")[0] not in allowed and not m.startswith("_sysconfigdata")}
    )
    assert foreign == []
