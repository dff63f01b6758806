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
"""

from __future__ import annotations

import json
import os

PYTHON = os.environ.get("IMG2TFRECORD_PYTHON", "/opt/img2tfrecord/venv/bin/python")
# The job runs as `python -m beam_pipeline [flags]`: the operator appends the flags
# (and its own --runner and --labels) after py_file.
PY_FILE = "beam_pipeline"
PY_OPTIONS = ["-m"]
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
