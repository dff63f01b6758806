"""img2tfrecord as a Dataflow Flex Template (built with the gcloud commands in docs/cloud.md).

launch (the template's parameters as in dataflow/metadata.json, its environment as the
documented `gcloud dataflow flex-template run`; the task waits for the job in the triggerer)
-> check_summary (summary.json on GCS checked, its counts as XCom).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG
from img2tfrecord_common import (
    DAG_DEFAULTS,
    PARAM_FLAGS,
    GcpSettings,
    check_summary_task,
    max_workers_param,
    text_param,
)
from img2tfrecord_operators import FlexLaunchOperator

DAG_ID = "img2tfrecord_flex"
gcp = GcpSettings(DAG_ID)

with DAG(
    dag_id=DAG_ID,
    description="Convert a bucket of images to TFRecords with the img2tfrecord Flex Template.",
    **DAG_DEFAULTS,
    params={
        **gcp.params(),
        **max_workers_param("max_workers"),
        "template": text_param(
            os.environ.get("IMG2TFRECORD_TEMPLATE", f"{gcp.bucket}/templates/img2tfrecord.json"),
            "Flex Template spec",
            "The spec written by `gcloud dataflow flex-template build`.",
            pattern="^gs://",
        ),
    },
    tags=["img2tfrecord", "dataflow"],
) as dag:
    launch = FlexLaunchOperator(
        task_id="launch",
        project_id=gcp.project,
        location=gcp.region,
        deferrable=True,
        body={
            "launchParameter": {
                "jobName": "img2tfrecord-{{ run_folder(dag_run) | lower }}",
                "containerSpecGcsPath": "{{ params.template }}",
                "parameters": {
                    **PARAM_FLAGS,
                    "overwrite": "true",
                    "sdk_container_image": "{{ params.container_image }}",
                },
                "environment": {
                    "tempLocation": f"{gcp.bucket}/temp",
                    "serviceAccountEmail": "{{ params.service_account }}",
                    "maxWorkers": "{{ params.max_workers }}",
                    "additionalExperiments": ["use_runner_v2"],
                },
            }
        },
    )
    launch >> check_summary_task(launch.task_id)
