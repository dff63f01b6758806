"""Run with the Airflow venv's Python: steps of a test plan against the DAGs folder, in one process.

`python tests/airflow_inspect.py DAGS_FOLDER PLAN.json OUT_DIR` (the DAGs folder is put on
sys.path, as Airflow's dag-processor and workers do, for the DAGs' shared modules). PLAN is a
list of steps, run in order; OUT_DIR/results.json maps each step's name to its result (and its duration, `seconds`), and
each step's output (Airflow's and the tasks' logs) goes to OUT_DIR/<name>.log. A step may set
`env` (a value of null unsets the variable) for its duration. Kinds:

- `inspect`: the DagBag's import errors, and per DAG its schedule, params (JSON schema,
  default, description) and tasks (type, upstream, retries, pool, deferrable, Beam fields).
- `run`: one `dag.test()` run of `dag_id` (`logical_date`: ISO date or null for none,
  `conf`, `mark_success`: a task id regex marked success without running) -> run id, state,
  and per task its state, try number, max tries and XComs (as stored).
- `check`: check_summary's verdict (img2tfrecord_check.check_output) on `output_dir`;
  `started` is seconds since the epoch, "now", or null.
- `mirror`: the files of a local folder (`src`, a glob pattern that matches one folder)
  uploaded to `dest` (gs://) through the Airflow Google connection, oldest first.
- `tool`: img2tfrecord_operators.ToolProcess on small Python programs (`cases`: code that
  prints and exits) -> each line's log level and the exception raised; for a program that
  prints Beam's "Created job with id", the job id and whether it ran on until stop().

Errors of a step are reported as its result (`error`), not raised.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path


@contextlib.contextmanager
def _environment(changes: dict):
    saved = {k: os.environ.get(k) for k in changes}
    for k, v in changes.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@contextlib.contextmanager
def _output_to(path: Path):
    """File descriptors 1 and 2 (this process's and its children's output) go to `path`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def inspect(dags_folder: str, step: dict) -> dict:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator

    bag = DagBag(dag_folder=dags_folder)
    out: dict = {"import_errors": {Path(k).name: str(v) for k, v in bag.import_errors.items()}, "dags": {}}
    for dag_id, dag in sorted(bag.dags.items()):
        params = {
            name: {"schema": p.schema, "default": p.value, "description": p.description}
            for name, p in dag.params.items()
            for p in [dag.params.get_param(name)]
        }
        tasks = {}
        for task in dag.tasks:
            info = {
                "type": type(task).__name__,
                "bases": [c.__name__ for c in type(task).__mro__],
                "upstream": sorted(task.upstream_task_ids),
                "retries": task.retries,
                "retry_delay": task.retry_delay.total_seconds(),
                "pool": task.pool,
                "deferrable": getattr(task, "deferrable", None),
            }
            if isinstance(task, BeamRunPythonPipelineOperator):
                info.update(
                    runner=task.runner,
                    py_interpreter=task.py_interpreter,
                    py_options=task.py_options,
                    py_file=task.py_file,
                )
            tasks[task.task_id] = info
        out["dags"][dag_id] = {"schedule": str(dag.schedule), "params": params, "tasks": tasks}
    return out


def run(dags_folder: str, step: dict) -> dict:
    import re

    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.sdk import timezone
    from airflow.utils.session import create_session
    from sqlalchemy import select

    dag = DagBag(dag_folder=dags_folder).get_dag(step["dag_id"])
    date = step.get("logical_date")
    dr = dag.test(
        logical_date=timezone.parse(date) if date else None,
        run_conf=step.get("conf"),
        mark_success_pattern=re.compile(step["mark_success"]) if step.get("mark_success") else None,
    )
    tasks = {
        ti.task_id: {
            "state": ti.state and str(ti.state),
            "try_number": ti.try_number,
            "max_tries": ti.max_tries,
        }
        for ti in dr.get_task_instances()
    }
    with create_session() as session:  # a later run of the same logical date clears them
        xcoms = session.execute(
            select(XComModel.task_id, XComModel.key, XComModel.value).where(XComModel.run_id == dr.run_id)
        ).all()
    for task_id, key, value in xcoms:
        tasks[task_id][key] = value
    return {
        "run_id": dr.run_id,
        "state": str(dr.state),
        "run_after": dr.run_after.isoformat(),
        "tasks": tasks,
    }


def check(dags_folder: str, step: dict) -> dict:
    from img2tfrecord_check import check_output

    started = time.time() if step.get("started") == "now" else step.get("started")
    return {"summary": check_output(step["output_dir"], step.get("max_failure_ratio", 1.0), started)}


def mirror(dags_folder: str, step: dict) -> dict:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    bucket_name, _, prefix = step["dest"][len("gs://") :].partition("/")
    bucket = GCSHook().get_conn().bucket(bucket_name)
    (src,) = glob.glob(step["src"])
    files = sorted((p for p in Path(src).iterdir() if p.is_file()), key=lambda p: p.stat().st_mtime_ns)
    for path in files:
        bucket.blob(f"{prefix}/{path.name}").upload_from_filename(str(path))
    return {"uploaded": [p.name for p in files]}


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def tool(dags_folder: str, step: dict) -> dict:
    from airflow.providers.google.cloud.hooks.dataflow import (
        process_line_and_extract_dataflow_job_id_callback,
    )
    from img2tfrecord_operators import ToolProcess

    results = []
    for code in step["cases"]:
        records = _Collect()
        log = logging.getLogger(f"img2tfrecord_tool_{len(results)}")
        log.propagate, log.level = False, logging.DEBUG
        log.addHandler(records)
        process, raised, job = ToolProcess([sys.executable, "-c", code], log), None, []
        try:  # with the Beam operator's Dataflow callbacks: run() returns once a job is submitted
            process.run(
                process_line_and_extract_dataflow_job_id_callback(job.append), functools.partial(bool, job)
            )
        except Exception as e:
            raised = {
                "type": type(e).__name__,
                "bases": [c.__name__ for c in type(e).__mro__],
                "message": str(e),
            }
        result = {"raised": raised, "job_id": job[0] if job else None}
        if job:
            result["running_after_submit"] = process.proc.poll() is None
            process.stop()
            result["stopped"] = process.proc.poll() is not None
        result["lines"] = [
            [r.levelname, r.getMessage()] for r in records.records[1:]
        ]  # after "Running command"
        results.append(result)
    return {"cases": results}


KINDS = {"inspect": inspect, "run": run, "check": check, "mirror": mirror, "tool": tool}


def main(dags_folder: str, plan_path: str, out_dir: str) -> None:
    sys.path.insert(0, dags_folder)  # as Airflow's dag-processor and workers do
    out = Path(out_dir)
    results = {}
    for step in json.loads(Path(plan_path).read_text()):
        with _environment(step.get("env", {})), _output_to(out / f"{step['name']}.log"):
            began = time.monotonic()
            try:
                results[step["name"]] = KINDS[step["kind"]](dags_folder, step)
            except Exception as e:
                traceback.print_exc()
                results[step["name"]] = {"error": f"{type(e).__name__}: {e}"}
            results[step["name"]]["seconds"] = round(time.monotonic() - began, 2)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main(*sys.argv[1:4])
