"""img2tfrecord on a local schedule: the DirectRunner on the Airflow worker itself.

convert (BeamRunPythonPipelineOperator, DirectRunner) -> check_summary (summary.json as XCom).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG
from img2tfrecord_common import COMMON_PARAMS, DAG_DEFAULTS, check_summary_task, convert_task

with DAG(
    dag_id="img2tfrecord_local",
    description="Convert an image folder to TFRecords with the DirectRunner, once a day.",
    **DAG_DEFAULTS,
    params={
        **COMMON_PARAMS,
        "input": os.environ.get("IMG2TFRECORD_INPUT", "/data/images"),
        "output_root": os.environ.get("IMG2TFRECORD_OUTPUT_ROOT", "/data/tfrecords"),
    },
    tags=["img2tfrecord"],
) as dag:
    convert_task("DirectRunner") >> check_summary_task()
