"""img2tfrecord on Dataflow: the same job, submitted with the DataflowRunner.

convert (BeamRunPythonPipelineOperator + DataflowConfiguration; workers run the custom
container built from the repository's Dockerfile) -> check_summary (summary.json from GCS).
"""

from __future__ import annotations

import os

from airflow.providers.google.cloud.operators.dataflow import DataflowConfiguration
from airflow.sdk import DAG
from img2tfrecord_common import (
    BUCKET,
    COMMON_PARAMS,
    DAG_DEFAULTS,
    GCS_PARAMS,
    PROJECT,
    REGION,
    check_summary_task,
    convert_task,
)

with DAG(
    dag_id="img2tfrecord_dataflow",
    description="Convert a bucket of images to TFRecords on Dataflow, once a day.",
    **DAG_DEFAULTS,
    params={
        **COMMON_PARAMS,
        **GCS_PARAMS,
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
    convert = convert_task(
        "DataflowRunner",
        {
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
    convert >> check_summary_task()
