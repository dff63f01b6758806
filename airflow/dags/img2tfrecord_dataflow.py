"""img2tfrecord on Dataflow: the same CLI, submitting the job with the DataflowRunner.

convert (the CLI with the DataflowRunner; workers run the custom container built from the
repository's Dockerfile; once the job is submitted the task waits for it in the triggerer,
not in a worker slot) -> check_summary (summary.json on GCS checked, its counts as XCom).
"""

from __future__ import annotations

from airflow.sdk import DAG
from img2tfrecord_common import DAG_DEFAULTS, GcpSettings, check_summary_task, convert_task, max_workers_param

DAG_ID = "img2tfrecord_dataflow"
gcp = GcpSettings(DAG_ID)

with DAG(
    dag_id=DAG_ID,
    description="Convert a bucket of images to TFRecords on Dataflow, once a day.",
    **DAG_DEFAULTS,
    params={**gcp.params(), **max_workers_param("max_num_workers")},
    tags=["img2tfrecord", "dataflow"],
) as dag:
    convert = convert_task(
        "DataflowRunner",
        {
            "temp_location": f"{gcp.bucket}/temp",
            "staging_location": f"{gcp.bucket}/staging",
            "sdk_container_image": "{{ params.container_image }}",
            "service_account_email": "{{ params.service_account }}",
            "max_num_workers": "{{ params.max_num_workers }}",
        },
        dataflow_config={
            "job_name": "img2tfrecord-{{ run_folder(dag_run) | lower }}",
            "project_id": gcp.project,
            "location": gcp.region,
            "wait_until_finished": True,
        },
        deferrable=True,
    )
    convert >> check_summary_task(convert.task_id)
