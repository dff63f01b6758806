"""Shared by the img2tfrecord DAGs: settings, params, the convert task and check_summary.

Settings are environment variables, read when a DAG file is parsed: set them for the
dag-processor (params' defaults, the trigger form, import errors) and for the workers (the
command a task runs). docs/cloud.md ("Airflow") lists them:
  IMG2TFRECORD_PYTHON       absolute path of a Python that has img2tfrecord installed
  IMG2TFRECORD_INPUT, IMG2TFRECORD_OUTPUT_ROOT
                            local DAG: the default input folder and output root
  IMG2TFRECORD_PROJECT, IMG2TFRECORD_BUCKET (gs://...)
                            Dataflow DAGs (required): project, and bucket for temp and staging
  IMG2TFRECORD_REGION       Dataflow DAGs: region (europe-west1)
  IMG2TFRECORD_GCS_INPUT, IMG2TFRECORD_GCS_OUTPUT_ROOT
                            Dataflow DAGs: default input and output root (in the bucket)
  IMG2TFRECORD_IMAGE, IMG2TFRECORD_SERVICE_ACCOUNT, IMG2TFRECORD_TEMPLATE
                            Dataflow DAGs: default worker container, worker service account,
                            Flex Template spec
  IMG2TFRECORD_MAX_FAILURE_RATIO
                            default failure budget of a run (img2tfrecord's own: 0.01)

Each run writes to `<output_root>/<folder>`: its logical date as YYYYMMDD, or, for a run
triggered without one, its run_after as YYYYMMDDTHHMMSS (run_folder), with --overwrite.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum
from airflow.sdk import Param, task
from img2tfrecord_check import check_output
from img2tfrecord_operators import STARTED_KEY, ConvertOperator

# Placeholders of the docs' examples: a DAG that would run with them is refused when parsed.
PLACEHOLDER_PROJECT, PLACEHOLDER_BUCKET = "my-project", "gs://my-project-img2tfrecord"
# The local DAG's convert task runs in this pool (create it: docs/cloud.md "Airflow").
LOCAL_POOL = "img2tfrecord_local"
# The job runs as `python -m beam_pipeline [flags]`: the operator appends the flags
# (and its own --runner and --labels) after py_file.
PY_FILE = "beam_pipeline"
PY_OPTIONS = ["-m"]
# img2tfrecord's choices that mean the same on every runner (a test keeps them in step).
COMPRESSIONS = ["none", "gzip"]
SCHEMAS = ["odapi", "slim", "tfds", "tutorial"]


def run_folder(dag_run) -> str:
    """The run's output folder name: YYYYMMDD of its logical date, or YYYYMMDDTHHMMSS of its
    run_after when it has none (triggered from the UI, the REST API or `airflow dags trigger`)."""
    if dag_run.logical_date is not None:
        return dag_run.logical_date.strftime("%Y%m%d")
    return dag_run.run_after.strftime("%Y%m%dT%H%M%S")


# Every img2tfrecord DAG: daily, from 2026-01-01, no backfill, one run at a time; a failed
# task is retried twice, 3 minutes apart (a dead run's claim expires in 2).
DAG_DEFAULTS = {
    "schedule": "@daily",
    "start_date": pendulum.datetime(2026, 1, 1, tz="UTC"),
    "catchup": False,
    "max_active_runs": 1,
    "default_args": {"retries": 2, "retry_delay": timedelta(minutes=3)},
    "user_defined_macros": {"run_folder": run_folder},
}
OUTPUT_DIR = "{{ params.output_root }}/{{ run_folder(dag_run) }}"


def text_param(default: str, title: str, description: str, **schema) -> Param:
    """A non-empty string param."""
    return Param(default, type="string", minLength=1, title=title, description=description, **schema)


def common_params(input_default: str, output_root_default: str) -> dict[str, Param]:
    """The params every img2tfrecord DAG takes."""
    return {
        "input": text_param(
            input_default, "Input", "Folder of images, one subfolder per class (img2tfrecord --input)."
        ),
        "output_root": text_param(
            output_root_default,
            "Output root",
            "Each run writes to <output_root>/<YYYYMMDD of its logical date> (<YYYYMMDDTHHMMSS of "
            "run_after> without one), replacing that folder's dataset.",
        ),
        "max_failure_ratio": Param(
            float(os.environ.get("IMG2TFRECORD_MAX_FAILURE_RATIO", "0.01")),
            type="number",
            minimum=0,
            maximum=1,
            title="Failure budget",
            description="More failed images than this fraction: the task fails, nothing is "
            "published (--max_failure_ratio).",
        ),
        "compression": Param(
            "none",
            type="string",
            enum=COMPRESSIONS,
            title="Compression",
            description="gzip: .tfrecord.gz shards (TFDS cannot read them).",
        ),
        "schema": Param(
            "slim",
            type="string",
            enum=SCHEMAS,
            title="Feature schema",
            description="Feature keys preset of the Examples (--schema).",
        ),
    }


# The flags the params above become, for the CLI (convert_task) and the Flex Template.
PARAM_FLAGS = {
    "input": "{{ params.input }}",
    "output_dir": OUTPUT_DIR,
    "max_failure_ratio": "{{ params.max_failure_ratio }}",
    "compression": "{{ params.compression }}",
    "schema": "{{ params.schema }}",
}


class GcpSettings:
    """The Dataflow DAGs' settings; refuses to parse without a real project and bucket."""

    def __init__(self, dag_id: str):
        self.project = os.environ.get("IMG2TFRECORD_PROJECT", "")
        self.bucket = os.environ.get("IMG2TFRECORD_BUCKET", "").rstrip("/")
        if self.project in ("", PLACEHOLDER_PROJECT) or self.bucket in ("", PLACEHOLDER_BUCKET):
            raise ValueError(
                f"{dag_id}: set IMG2TFRECORD_PROJECT and IMG2TFRECORD_BUCKET (gs://...) to your "
                f"project and bucket in the environment of the dag-processor and the workers "
                f"(now {self.project or 'unset'!r} and {self.bucket or 'unset'!r}; docs/cloud.md, Airflow)"
            )
        if not self.bucket.startswith("gs://"):
            raise ValueError(f"{dag_id}: IMG2TFRECORD_BUCKET must be gs://..., not {self.bucket!r}")
        self.region = os.environ.get("IMG2TFRECORD_REGION", "europe-west1")
        self.image = os.environ.get(
            "IMG2TFRECORD_IMAGE", f"{self.region}-docker.pkg.dev/{self.project}/img2tfrecord/worker:0.1.0"
        )
        self.service_account = os.environ.get(
            "IMG2TFRECORD_SERVICE_ACCOUNT", f"img2tfrecord-worker@{self.project}.iam.gserviceaccount.com"
        )

    def params(self) -> dict[str, Param]:
        """common_params in the bucket, and the workers' container and service account."""
        return {
            **common_params(
                os.environ.get("IMG2TFRECORD_GCS_INPUT", f"{self.bucket}/images"),
                os.environ.get("IMG2TFRECORD_GCS_OUTPUT_ROOT", f"{self.bucket}/tfrecords"),
            ),
            "container_image": text_param(
                self.image, "Worker container", "The workers' image, built from the repository's Dockerfile."
            ),
            "service_account": text_param(
                self.service_account,
                "Worker service account",
                "Email of the service account the workers run as.",
            ),
        }


def max_workers_param(name: str) -> dict[str, Param]:
    return {
        name: Param(
            20,
            type="integer",
            minimum=1,
            title="Max workers",
            description="Upper bound of Dataflow's autoscaling (and of the job's cost).",
        )
    }


def convert_task(runner: str, options: dict | None = None, **kwargs) -> ConvertOperator:
    """The `convert` task: `$IMG2TFRECORD_PYTHON -m beam_pipeline` on the run's params."""
    return ConvertOperator(
        task_id="convert",
        runner=runner,
        py_file=PY_FILE,
        py_options=PY_OPTIONS,
        py_interpreter=os.environ.get("IMG2TFRECORD_PYTHON", "/opt/img2tfrecord/venv/bin/python"),
        pipeline_options={**PARAM_FLAGS, "overwrite": True, **(options or {})},
        **kwargs,
    )


def check_summary_task(upstream: str):
    """The `check_summary` task: the run's dataset checked (img2tfrecord_check), its counts
    returned as XCom for the next task."""

    @task
    def check_summary(output_dir: str, max_failure_ratio: float, ti=None, dag_run=None) -> dict:
        started = ti.xcom_pull(task_ids=upstream, key=STARTED_KEY)
        if started is None and dag_run.start_date is not None:  # convert marked success by hand
            started = dag_run.start_date.timestamp()
        return check_output(output_dir, float(max_failure_ratio), started)

    return check_summary(OUTPUT_DIR, "{{ params.max_failure_ratio }}")
