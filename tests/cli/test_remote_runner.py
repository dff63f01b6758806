"""A remote runner with a path on this machine, and classic templates: refused in one line (exit 2)
before any credential check, claim or graph, through the real CLI with no Google credentials."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_pipeline.cli.checks import remote_workers
from tests.conftest import write_image

REPO = Path(__file__).resolve().parents[2]
DATAFLOW = ["--runner", "DataflowRunner", "--project", "p", "--region", "europe-west1"]
DATAFLOW += ["--temp_location", "gs://no-such-bucket/temp"]


def _cli(args: list[str], home: Path) -> subprocess.CompletedProcess:
    """`python -m beam_pipeline convert ARGS` with no Google credentials anywhere (nor an emulator)."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR", "CLOUDSDK"))
    }
    env.update(HOME=str(home), CLOUDSDK_CONFIG=str(home / "gcloud"), NO_GCE_CHECK="True")
    return subprocess.run(
        [sys.executable, "-m", "beam_pipeline", "convert", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,  # a hang guard: the job used to be built and submitted, then hang
    )


@pytest.fixture
def local(tmp_path: Path) -> Path:
    write_image(tmp_path / "in" / "cat" / "a.png", (4, 4))
    (tmp_path / "t.csv").write_text("key,label\na,cat\n")
    (tmp_path / "names.txt").write_text("cat\n")
    return tmp_path


def _refused(done: subprocess.CompletedProcess, flag: str, path: Path) -> None:
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"img2tfrecord: error: {flag} {path} is a path on this machine"), line
    assert "gs://" in line


def test_dataflow_with_both_paths_local_exits_at_once_and_claims_nothing(local):
    out = local / "out"
    done = _cli(["--input", str(local / "in"), "--output_dir", str(out), *DATAFLOW], local)
    _refused(done, "--input", local / "in")
    assert "DataflowRunner runs the job on Google Cloud workers" in done.stderr
    assert not out.exists()  # no claim, no marker, no temp folder


@pytest.mark.parametrize("flag", ["--output_dir", "--labels", "--label_map"])
def test_dataflow_with_one_local_path_is_refused_before_the_credential_check(local, flag):
    paths = {
        "--input": "gs://no-such-bucket/in",
        "--output_dir": "gs://no-such-bucket/out",
        "--labels": "gs://no-such-bucket/t.csv",
        "--label_map": "gs://no-such-bucket/names.txt",
    }
    paths[flag] = {
        "--output_dir": local / "out",
        "--labels": local / "t.csv",
        "--label_map": local / "names.txt",
    }[flag]
    args = [a for flag_path in paths.items() for a in map(str, flag_path)]
    done = _cli([*args, "--key_column", "key", *DATAFLOW], local)
    _refused(done, flag, paths[flag])
    assert "credentials" not in done.stderr
    assert not (local / "out").exists()


def test_portable_runner_at_another_host_is_refused(local):
    args = ["--input", "gs://no-such-bucket/in", "--output_dir", str(local / "out")]
    done = _cli([*args, "--runner", "PortableRunner", "--job_endpoint", "beam-jobs.example.com:8099"], local)
    _refused(done, "--output_dir", local / "out")
    assert "--job_endpoint beam-jobs.example.com:8099 runs the job on another machine" in done.stderr


def test_classic_template_is_refused_pointing_at_the_flex_template(local):
    args = ["--input", "gs://no-such-bucket/in", "--output_dir", "gs://no-such-bucket/out", *DATAFLOW]
    done = _cli([*args, "--template_location", "gs://no-such-bucket/templates/t.json"], local)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("img2tfrecord: error: --template_location: ") and "Flex Template" in line


PORTABLE = "--runner PortableRunner --job_endpoint"


@pytest.mark.parametrize(
    "args, remote",
    [
        ("", False),
        ("--runner DirectRunner", False),
        ("--runner FnApiRunner --direct_num_workers 2", False),
        ("--runner dataflow", True),
        ("--runner apache_beam.runners.dataflow.dataflow_runner.DataflowRunner", True),
        # Beam's Python job server here and a worker pool here: the tests' own portable runs.
        (
            f"{PORTABLE} localhost:8099 --environment_type EXTERNAL --environment_config localhost:50000",
            False,
        ),
        (f"{PORTABLE} embed --environment_type LOOPBACK", False),
        (f"{PORTABLE} 127.0.0.1:8099 --environment_type PROCESS", False),
        (f"{PORTABLE} localhost:8099", True),  # SDK workers in Docker, PortableRunner's default
        (
            f"{PORTABLE} localhost:8099 --environment_type EXTERNAL "
            "--environment_option external_service_address=pool.internal:50000",
            True,
        ),
        (f"{PORTABLE} 10.0.0.7:8099 --environment_type LOOPBACK", True),
        ("--runner FlinkRunner", False),  # [auto]: an embedded Flink here, LOOPBACK workers
        ("--runner FlinkRunner --flink_master flink.internal:8081", True),
        ("--runner SparkRunner", False),  # local[4]
        ("--runner SparkRunner --spark_master_url spark://spark.internal:7077", True),
        ("--runner PrismRunner", False),
    ],
)
def test_which_runners_are_remote(args, remote):
    assert (remote_workers(PipelineOptions(args.split())) is not None) == remote
