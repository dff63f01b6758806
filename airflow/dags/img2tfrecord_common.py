"""Shared by the img2tfrecord DAGs: configuration from the environment and the summary check.

Settings (environment of the Airflow workers; every one can be overridden per run through
the DAG params):
  IMG2TFRECORD_PYTHON       absolute path of a Python that has img2tfrecord installed
  IMG2TFRECORD_INPUT        local DAG: folder of class folders
  IMG2TFRECORD_OUTPUT_ROOT  local DAG: each run writes to <root>/<logical date, YYYYMMDD>
  IMG2TFRECORD_PROJECT, IMG2TFRECORD_REGION, IMG2TFRECORD_BUCKET (gs://...)
                            Dataflow DAGs: where the job runs and its temp/staging bucket
  IMG2TFRECORD_GCS_INPUT, IMG2TFRECORD_GCS_OUTPUT_ROOT
                            Dataflow DAGs: input and output root (default: in the bucket)
  IMG2TFRECORD_IMAGE, IMG2TFRECORD_SERVICE_ACCOUNT, IMG2TFRECORD_TEMPLATE
                            worker container, worker service account, Flex Template spec
  IMG2TFRECORD_MAX_FAILURE_RATIO
                            above this fraction of failed images the task fails (exit 3)
"""

from __future__ import annotations

import json
import os

import pendulum
from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from airflow.sdk import task

PYTHON = os.environ.get("IMG2TFRECORD_PYTHON", "/opt/img2tfrecord/venv/bin/python")
# Dataflow DAGs: project, region and the bucket for temp, staging, input and output.
PROJECT = os.environ.get("IMG2TFRECORD_PROJECT", "my-project")
REGION = os.environ.get("IMG2TFRECORD_REGION", "europe-west1")
BUCKET = os.environ.get("IMG2TFRECORD_BUCKET", "gs://my-project-img2tfrecord")
GCS_PARAMS = {
    "input": os.environ.get("IMG2TFRECORD_GCS_INPUT", f"{BUCKET}/images"),
    "output_root": os.environ.get("IMG2TFRECORD_GCS_OUTPUT_ROOT", f"{BUCKET}/tfrecords"),
}
# The job runs as `python -m beam_pipeline [flags]`: the operator appends the flags
# (and its own --runner and --labels) after py_file.
PY_FILE = "beam_pipeline"
PY_OPTIONS = ["-m"]
# Every img2tfrecord DAG: daily, from 2026-01-01, no backfill, one run at a time.
DAG_DEFAULTS = {
    "schedule": "@daily",
    "start_date": pendulum.datetime(2026, 1, 1, tz="UTC"),
    "catchup": False,
    "max_active_runs": 1,
}
# Every DAG's params: the failure budget of a run (img2tfrecord's own default: 0.01).
COMMON_PARAMS = {"max_failure_ratio": os.environ.get("IMG2TFRECORD_MAX_FAILURE_RATIO", "0.01")}
# One output folder per logical date, replaced on a rerun: runs are idempotent.
OUTPUT_DIR = "{{ params.output_root }}/{{ ds_nodash }}"


def _read_bytes(path: str) -> bytes:
    """A local file, or a gs:// object through the Airflow Google connection."""
    if not path.startswith("gs://"):
        with open(path, "rb") as f:
            return f.read()
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    bucket, _, name = path[len("gs://") :].partition("/")
    return GCSHook().download(bucket_name=bucket, object_name=name)


def read_summary(output_dir: str) -> dict:
    """summary.json of a finished conversion, checked; what the next task gets (XCom).

    Raises:
      ValueError: no image written, or the counts do not add up.
    """
    summary = json.loads(_read_bytes(output_dir.rstrip("/") + "/summary.json"))
    if summary["listed"] != summary["written"] + summary["failed"]:
        raise ValueError(f"{output_dir}: listed != written + failed in summary.json")
    if not summary["written"]:
        raise ValueError(f"{output_dir}: no image was written")
    return {
        "output_dir": output_dir,
        "listed": summary["listed"],
        "written": summary["written"],
        "failed": summary["failed"],
        "num_classes": summary["num_classes"],
        "splits": {name: s["shards"] for name, s in summary["splits"].items()},
    }


def convert_task(runner: str, options: dict | None = None, **kwargs) -> BeamRunPythonPipelineOperator:
    """The `convert` task: `python -m beam_pipeline` with the run's input and dated output."""
    return BeamRunPythonPipelineOperator(
        task_id="convert",
        runner=runner,
        py_file=PY_FILE,
        py_options=PY_OPTIONS,
        py_interpreter=PYTHON,
        pipeline_options={
            "input": "{{ params.input }}",
            "output_dir": OUTPUT_DIR,
            "overwrite": True,
            "quiet": True,
            "max_failure_ratio": "{{ params.max_failure_ratio }}",
            **(options or {}),
        },
        **kwargs,
    )


def check_summary_task():
    """The `check_summary` task: summary.json checked and returned as XCom for the next task."""

    @task
    def check_summary(output_dir: str) -> dict:
        return read_summary(output_dir)

    return check_summary(OUTPUT_DIR)
