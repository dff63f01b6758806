"""img2tfrecord as a Dataflow Flex Template (built with the gcloud commands in README.md).

launch (DataflowStartFlexTemplateOperator; parameters as in dataflow/metadata.json)
-> check_summary (summary.json from GCS).
"""

from __future__ import annotations

import os

import pendulum
from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator
from airflow.sdk import DAG, task
from img2tfrecord_common import OUTPUT_DIR, read_summary

PROJECT = os.environ.get("IMG2TFRECORD_PROJECT", "my-project")
REGION = os.environ.get("IMG2TFRECORD_REGION", "europe-west1")
BUCKET = os.environ.get("IMG2TFRECORD_BUCKET", "gs://my-project-img2tfrecord")

with DAG(
    dag_id="img2tfrecord_flex",
    description="Convert a bucket of images to TFRecords with the img2tfrecord Flex Template.",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    params={
        "input": os.environ.get("IMG2TFRECORD_GCS_INPUT", f"{BUCKET}/images"),
        "output_root": os.environ.get("IMG2TFRECORD_GCS_OUTPUT_ROOT", f"{BUCKET}/tfrecords"),
        "template": os.environ.get("IMG2TFRECORD_TEMPLATE", f"{BUCKET}/templates/img2tfrecord.json"),
    },
    tags=["img2tfrecord", "dataflow"],
) as dag:
    launch = DataflowStartFlexTemplateOperator(
        task_id="launch",
        project_id=PROJECT,
        location=REGION,
        wait_until_finished=True,
        body={
            "launchParameter": {
                "jobName": "img2tfrecord-flex-{{ ds_nodash }}",
                "containerSpecGcsPath": "{{ params.template }}",
                "parameters": {
                    "input": "{{ params.input }}",
                    "output_dir": OUTPUT_DIR,
                    "overwrite": "true",
                },
                "environment": {"tempLocation": f"{BUCKET}/temp", "maxWorkers": 20},
            }
        },
    )

    @task
    def check_summary(output_dir: str) -> dict:
        """summary.json of the job (read from GCS); downstream tasks read it from XCom."""
        return read_summary(output_dir)

    launch >> check_summary(OUTPUT_DIR)
