"""img2tfrecord on a local schedule: the DirectRunner on the Airflow worker itself.

convert (BeamRunPythonPipelineOperator, DirectRunner) -> check_summary (summary.json as XCom).
"""

from __future__ import annotations

import os

import pendulum
from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from airflow.sdk import DAG, task
from img2tfrecord_common import OUTPUT_DIR, PY_FILE, PY_OPTIONS, PYTHON, read_summary

with DAG(
    dag_id="img2tfrecord_local",
    description="Convert an image folder to TFRecords with the DirectRunner, once a day.",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "input": os.environ.get("IMG2TFRECORD_INPUT", "/data/images"),
        "output_root": os.environ.get("IMG2TFRECORD_OUTPUT_ROOT", "/data/tfrecords"),
    },
    tags=["img2tfrecord"],
) as dag:
    convert = BeamRunPythonPipelineOperator(
        task_id="convert",
        runner="DirectRunner",
        py_file=PY_FILE,
        py_options=PY_OPTIONS,
        py_interpreter=PYTHON,
        pipeline_options={
            "input": "{{ params.input }}",
            "output_dir": OUTPUT_DIR,
            "overwrite": True,
            "quiet": True,
        },
    )

    @task
    def check_summary(output_dir: str) -> dict:
        """The conversion's summary.json, checked; downstream tasks read it from XCom."""
        return read_summary(output_dir)

    convert >> check_summary(OUTPUT_DIR)
