"""img2tfrecord on Dataflow: the same job, submitted with the DataflowRunner.

convert (BeamRunPythonPipelineOperator + DataflowConfiguration; workers run the custom
container built from the repository's Dockerfile) -> check_summary (summary.json from GCS).
"""

from __future__ import annotations

import os

import pendulum
from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
from airflow.providers.google.cloud.operators.dataflow import DataflowConfiguration
from airflow.sdk import DAG, task
from img2tfrecord_common import OUTPUT_DIR, PY_FILE, PY_OPTIONS, PYTHON, read_summary

PROJECT = os.environ.get("IMG2TFRECORD_PROJECT", "my-project")
REGION = os.environ.get("IMG2TFRECORD_REGION", "europe-west1")
BUCKET = os.environ.get("IMG2TFRECORD_BUCKET", "gs://my-project-img2tfrecord")

with DAG(
    dag_id="img2tfrecord_dataflow",
    description="Convert a bucket of images to TFRecords on Dataflow, once a day.",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "input": os.environ.get("IMG2TFRECORD_GCS_INPUT", f"{BUCKET}/images"),
        "output_root": os.environ.get("IMG2TFRECORD_GCS_OUTPUT_ROOT", f"{BUCKET}/tfrecords"),
        "container_image": os.environ.get(
            "IMG2TFRECORD_IMAGE", f"{REGION}-docker.pkg.dev/{PROJECT}/img2tfrecord/worker:0.1.0"
        ),
        "service_account": os.environ.get(
            "IMG2TFRECORD_SERVICE_ACCOUNT", f"img2tfrecord-worker@{PROJECT}.iam.gserviceaccount.com"
        ),
        "max_num_workers": 20,
    },
    tags=["img2tfrecord", "dataflow"],
) as dag:
    convert = BeamRunPythonPipelineOperator(
        task_id="convert",
        runner="DataflowRunner",
        py_file=PY_FILE,
        py_options=PY_OPTIONS,
        py_interpreter=PYTHON,
        pipeline_options={
            "input": "{{ params.input }}",
            "output_dir": OUTPUT_DIR,
            "overwrite": True,
            "quiet": True,
            "temp_location": f"{BUCKET}/temp",
            "staging_location": f"{BUCKET}/staging",
            "sdk_container_image": "{{ params.container_image }}",
            "service_account_email": "{{ params.service_account }}",
            "max_num_workers": "{{ params.max_num_workers }}",
        },
        dataflow_config=DataflowConfiguration(
            job_name="img2tfrecord-{{ ds_nodash }}",
            project_id=PROJECT,
            location=REGION,
            wait_until_finished=True,
            check_if_running=True,
        ),
    )

    @task
    def check_summary(output_dir: str) -> dict:
        """summary.json of the job (read from GCS); downstream tasks read it from XCom."""
        return read_summary(output_dir)

    convert >> check_summary(OUTPUT_DIR)
