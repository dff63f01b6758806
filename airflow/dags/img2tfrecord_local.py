"""img2tfrecord on a local schedule: the DirectRunner on the Airflow worker itself.

convert (the CLI with the DirectRunner, in the `img2tfrecord_local` pool: it takes every
core) -> check_summary (summary.json checked, its counts as XCom).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Param
from img2tfrecord_common import DAG_DEFAULTS, LOCAL_POOL, check_summary_task, common_params, convert_task

with DAG(
    dag_id="img2tfrecord_local",
    description="Convert an image folder to TFRecords with the DirectRunner, once a day.",
    **DAG_DEFAULTS,
    params={
        **common_params(
            os.environ.get("IMG2TFRECORD_INPUT", "/data/images"),
            os.environ.get("IMG2TFRECORD_OUTPUT_ROOT", "/data/tfrecords"),
        ),
        "progress_interval": Param(
            60.0,
            type="number",
            exclusiveMinimum=0,
            title="Progress interval",
            description="Seconds between the progress lines in the task log.",
        ),
    },
    tags=["img2tfrecord"],
) as dag:
    convert = convert_task(
        "DirectRunner",
        {"progress_interval": "{{ params.progress_interval }}"},
        pool=LOCAL_POOL,
    )
    convert >> check_summary_task(convert.task_id)
