"""Run with the Airflow venv's Python: loads the DAGs folder and writes each job's arguments as JSON.

`python tests/airflow_inspect.py DAGS_FOLDER OUT.json` (put on sys.path, as
Airflow's scheduler does, for the DAGs' shared module).

For every Beam task: the command line the operator would run (its own --runner and --labels
included, formatted by the provider's beam_options_to_args), the interpreter and the Dataflow
configuration; for the Flex Template task, its launch body. Templates are rendered for a
fixed logical date. Import errors are reported, not raised.
"""

from __future__ import annotations

import json
import sys

LOGICAL_DATE_NODASH = "20260102"


def _config(config, task, context, env) -> dict | None:
    """The DataflowConfiguration (kept as given: an object or a dict), rendered."""
    if config is None:
        return None
    fields = ("job_name", "project_id", "location", "wait_until_finished", "check_if_running")
    raw = {f: (config.get(f) if isinstance(config, dict) else getattr(config, f, None)) for f in fields}
    return task.render_template(raw, context, jinja_env=env)


def main(dags_folder: str, out_path: str) -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.providers.apache.beam.hooks.beam import beam_options_to_args
    from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator
    from airflow.providers.google.cloud.operators.dataflow import DataflowStartFlexTemplateOperator

    sys.path.insert(0, dags_folder)  # as Airflow's scheduler and CLI do
    bag = DagBag(dag_folder=dags_folder)
    out: dict = {"import_errors": {k: str(v) for k, v in bag.import_errors.items()}, "dags": {}}
    for dag_id, dag in sorted(bag.dags.items()):
        context = {"params": dag.params.dump(), "ds_nodash": LOGICAL_DATE_NODASH}
        env = dag.get_template_env()
        tasks = {}
        for task in dag.tasks:
            info: dict = {"type": type(task).__name__, "upstream": sorted(task.upstream_task_ids)}
            if isinstance(task, BeamRunPythonPipelineOperator):
                options = task.render_template(dict(task.pipeline_options), context, jinja_env=env)
                # What execute() and the hook add before formatting (see the provider's beam.py).
                options["labels"] = ["airflow-version=v3"]
                info.update(
                    runner=task.runner,
                    py_interpreter=task.py_interpreter,
                    py_options=task.py_options,
                    py_file=task.py_file,
                    args=[f"--runner={task.runner}", *beam_options_to_args(options)],
                    dataflow_config=_config(task.dataflow_config, task, context, env),
                )
            elif isinstance(task, DataflowStartFlexTemplateOperator):
                info["body"] = task.render_template(task.body, context, jinja_env=env)
            tasks[task.task_id] = info
        out["dags"][dag_id] = {"schedule": str(dag.schedule), "tasks": tasks}
    with open(out_path, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
