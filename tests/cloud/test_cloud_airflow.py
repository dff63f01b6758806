"""The Airflow DAGs, run by a real Airflow (its own venv, built by `make airflow-venv`).

Two tests, each with one Airflow home (one `airflow db migrate`):

- the local DAG run by `dag.test()` in one Airflow process (tests/airflow_inspect.py): a dated
  run read back with TensorFlow, a run without a logical date converting 2,000 images with
  progress lines in its log, a run with too many bad images failing once with the CLI's own
  line, check_summary refusing an older dataset next to a newer aborted run and an
  in-progress marker (on local folders and, through the Airflow Google connection, on gs://
  against the emulator), a misspelt conf key refused; the DAGs' params, retries and pools,
  and placeholders refused;
- `airflow dags test` of the local DAG killed with SIGTERM (its Beam processes gone within
  seconds, the task left for a retry), and the Dataflow and Flex DAGs' templates rendered
  by `airflow tasks render`, checked against the CLI's parser and dataflow/metadata.json.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions, WorkerOptions

from beam_pipeline.cli.argv import check_args
from beam_pipeline.cli.options import ConvertOptions, validate
from beam_pipeline.main import run as convert
from tests.conftest import read_records, write_image
from tests.gcs_emulator import start_emulator
from transforms.encoding.schema import PRESETS
from transforms.output.claim import claim_output
from transforms.output.publish import ABORTED_FAILURES_FILE, MARKER_FILE
from transforms.writing.shard import COMPRESSIONS

REPO = Path(__file__).resolve().parents[2]
AIRFLOW_VENV = REPO / ".airflow-venv"
DAGS = REPO / "airflow" / "dags"
DATE, DATE_NODASH = "2026-01-02", "20260102"
PROJECT, BUCKET = "img2tfrecord-test", "gs://img2tfrecord-airflow-test"
FAIL = "airflow.sdk.exceptions.AirflowFailException: "


def _airflow_home(tmp_path: Path, **settings: str) -> dict[str, str]:
    """The environment of Airflow commands with a migrated database in tmp_path."""
    if not (AIRFLOW_VENV / ".installed").exists():
        pytest.fail("the Airflow venv is missing: run `make airflow-venv` (`make test` does)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR"))}
    env.update(
        PATH=f"{AIRFLOW_VENV / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        AIRFLOW_HOME=str(tmp_path / "airflow-home"),
        AIRFLOW__CORE__DAGS_FOLDER=str(DAGS),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        NO_GCE_CHECK="true",
        IMG2TFRECORD_PYTHON=sys.executable,  # absolute, with img2tfrecord installed
        IMG2TFRECORD_PROJECT=PROJECT,
        IMG2TFRECORD_BUCKET=BUCKET,
        IMG2TFRECORD_MAX_FAILURE_RATIO="0.5",
        **settings,
    )
    migrated = subprocess.run(["airflow", "db", "migrate"], env=env, capture_output=True, text=True)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    return env


def _write_datasets(root: Path) -> dict[str, Path]:
    """good: 6 images and a broken one (1/7 fails, under the tests' 0.5 budget);
    bad: 2 images and 3 broken (3/5 fail); big: 2,000 tiny images."""
    sets = {name: root / name for name in ("good", "bad", "big")}
    for i in range(6):
        write_image(sets["good"] / ("cat", "dog")[i % 2] / f"{i}.png", (8, 6 + i), seed=i)
    (sets["good"] / "dog" / "broken.png").write_bytes(b"\x89PNG not really")
    for i in range(2):
        write_image(sets["bad"] / ("cat", "dog")[i] / f"{i}.png", (8, 6), seed=i)
    for i in range(3):
        (sets["bad"] / "dog" / f"broken{i}.png").write_bytes(b"\x89PNG not really")
    for i in range(2000):
        write_image(sets["big"] / ("a", "b")[i % 2] / f"{i}.png", (2, 2), seed=i)
    return sets


def _states(run: dict) -> dict[str, tuple]:
    """task id -> (state, try_number, max_tries) of one DAG run (as the driver found them)."""
    return {task: (t["state"], t["try_number"], t["max_tries"]) for task, t in run["tasks"].items()}


def _xcom(run: dict, task_id: str, key: str = "return_value"):
    value = run["tasks"][task_id][key]
    return json.loads(value) if isinstance(value, str) else value


def _failure(log: str) -> str:
    """The message of the exception a task failed with."""
    return re.search(r"^airflow\.sdk\.exceptions\.\w+: (.*)$", log, re.M).group(1)


def test_local_dag_runs_fails_once_and_check_summary_refuses_stale_output(tmp_path, subtests):
    data = _write_datasets(tmp_path / "images")
    out_root = tmp_path / "tfrecords"
    folder = {d: str(out_root / d.replace("-", "")) for d in (DATE, "2026-01-03", "2026-01-04")}
    launched = time.time()
    # 2026-01-03 holds a dataset and a live run's claim (a rerun with --overwrite underway).
    convert(
        ["--input", str(data["good"]), "--output_dir", folder["2026-01-03"], "--max_failure_ratio", "0.5"]
    )
    live = claim_output(folder["2026-01-03"], True, "live-run")
    emulator = start_emulator(tmp_path, [BUCKET[len("gs://") :]])
    try:
        env = _airflow_home(
            tmp_path, IMG2TFRECORD_INPUT=str(data["good"]), IMG2TFRECORD_OUTPUT_ROOT=str(out_root)
        )
        gcs = {**emulator.env, "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": "google-cloud-platform://"}
        bad = {"input": str(data["bad"])}
        local = {"kind": "run", "dag_id": "img2tfrecord_local"}
        plan = [
            {"name": "inspect", "kind": "inspect"},
            {
                "name": "placeholders",
                "kind": "inspect",
                "env": {
                    "IMG2TFRECORD_PROJECT": "my-project",
                    "IMG2TFRECORD_BUCKET": "gs://my-project-img2tfrecord",
                },
            },
            {
                "name": "tool",
                "kind": "tool",
                "cases": [
                    "import sys; sys.stderr.write('WARNING apache_beam.io: slow\\n  its second line\\n"
                    "img2tfrecord: 1/2 images\\nimg2tfrecord: error: no images\\n'); sys.exit(2)",
                    "import sys; sys.stderr.write('img2tfrecord: error: --output_dir /x is being written by "
                    "another img2tfrecord run (run 1)\\n'); sys.exit(2)",
                    "raise OSError('the store is down')",
                    "import sys; sys.exit(3)",
                    "import sys, time; sys.stderr.write('INFO apache_beam.runners.dataflow.dataflow_runner: "
                    "Created job with id: [2026-01-02_01_02_03-123]\\n'); sys.stderr.flush(); time.sleep(60)",
                ],
            },
            {**local, "name": "dated", "logical_date": DATE},
            {"name": "stale", "kind": "check", "output_dir": folder[DATE], "started": "now"},
            {**local, "name": "too_many", "logical_date": DATE, "conf": bad},
            {**local, "name": "aborted", "logical_date": DATE, "mark_success": "convert"},
            {**local, "name": "marker", "logical_date": "2026-01-03", "mark_success": "convert"},
            {**local, "name": "misspelt", "logical_date": "2026-01-04", "conf": {"inputs": str(data["bad"])}},
            {
                **local,
                "name": "no_date",
                "logical_date": None,
                "conf": {"input": str(data["big"]), "progress_interval": 0.05},
            },
        ]
        gs_root = f"{BUCKET}/tfrecords"
        plan += [
            {**step, "env": gcs}
            for step in (
                {
                    "name": "mirror_aborted",
                    "kind": "mirror",
                    "src": folder[DATE],
                    "dest": f"{gs_root}/aborted",
                },
                {
                    "name": "mirror_marker",
                    "kind": "mirror",
                    "src": folder["2026-01-03"],
                    "dest": f"{gs_root}/marker",
                },
                {
                    "name": "mirror_fresh",
                    "kind": "mirror",
                    "src": f"{out_root}/*T*",
                    "dest": f"{gs_root}/fresh",
                },
                {"name": "gs_aborted", "kind": "check", "output_dir": f"{gs_root}/aborted", "started": None},
                {"name": "gs_marker", "kind": "check", "output_dir": f"{gs_root}/marker", "started": None},
                {"name": "gs_fresh", "kind": "check", "output_dir": f"{gs_root}/fresh", "started": launched},
                {"name": "gs_stale", "kind": "check", "output_dir": f"{gs_root}/fresh", "started": "now"},
            )
        ]
        (tmp_path / "plan.json").write_text(json.dumps(plan))
        logs = tmp_path / "logs"
        logs.mkdir()
        done = subprocess.run(
            [
                "python",
                str(REPO / "tests" / "airflow_inspect.py"),
                str(DAGS),
                str(tmp_path / "plan.json"),
                str(logs),
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-5000:]
    finally:
        emulator.stop()
        live.release()
    results = json.loads((logs / "results.json").read_text())
    log = {step["name"]: (logs / f"{step['name']}.log").read_text() for step in plan}
    no_date = results["no_date"]
    stamp = datetime.fromisoformat(no_date["run_after"]).strftime("%Y%m%dT%H%M%S")

    with subtests.test("the DAGs: typed params, retries, pool, deferrable waits"):
        dags = results["inspect"]
        assert dags["import_errors"] == {}
        assert set(dags["dags"]) == {"img2tfrecord_local", "img2tfrecord_dataflow", "img2tfrecord_flex"}
        for dag in dags["dags"].values():
            assert dag["schedule"] == "@daily"
            assert dag["tasks"]["check_summary"]["upstream"] in (["convert"], ["launch"])
            for task in dag["tasks"].values():
                assert (task["retries"], task["retry_delay"]) == (2, 180.0)
            for name, param in dag["params"].items():
                assert param["schema"].get("type") and param["description"], name
            assert sorted(dag["params"]["compression"]["schema"]["enum"]) == sorted(COMPRESSIONS)
            assert sorted(dag["params"]["schema"]["schema"]["enum"]) == sorted(PRESETS)
            ratio = dag["params"]["max_failure_ratio"]["schema"]
            assert (ratio["type"], ratio["minimum"], ratio["maximum"]) == ("number", 0, 1)
        local = dags["dags"]["img2tfrecord_local"]["tasks"]["convert"]
        assert "BeamRunPythonPipelineOperator" in local["bases"] and local["runner"] == "DirectRunner"
        assert local["py_interpreter"] == sys.executable and local["pool"] == "img2tfrecord_local"
        assert local["deferrable"] is False
        cloud = dags["dags"]["img2tfrecord_dataflow"]["tasks"]["convert"]
        assert cloud["runner"] == "DataflowRunner" and cloud["deferrable"] is True
        assert os.path.isabs(cloud["py_interpreter"]) and cloud["py_options"] == ["-m"]
        flex = dags["dags"]["img2tfrecord_flex"]
        assert "DataflowStartFlexTemplateOperator" in flex["tasks"]["launch"]["bases"]
        assert flex["tasks"]["launch"]["deferrable"] is True
        assert {"container_image", "service_account", "max_workers", "max_failure_ratio"} <= set(
            flex["params"]
        )
        assert flex["params"]["max_workers"]["schema"]["type"] == "integer"

    with subtests.test("placeholder project and bucket: the cloud DAGs do not import"):
        errors = results["placeholders"]["import_errors"]
        assert set(errors) == {"img2tfrecord_dataflow.py", "img2tfrecord_flex.py"}
        for error in errors.values():
            assert "set IMG2TFRECORD_PROJECT and IMG2TFRECORD_BUCKET" in error and "'my-project'" in error

    with subtests.test("the CLI's exit: 2 and 3 fail for good with its line, 1 and a busy folder retry"):
        usage, busy, crash, bare, submitted = results["tool"]["cases"]
        assert usage["raised"]["type"] == "AirflowFailException"
        assert usage["raised"]["message"] == "img2tfrecord: error: no images"
        assert usage["lines"] == [
            ["WARNING", "WARNING apache_beam.io: slow"],
            ["WARNING", "  its second line"],
            ["INFO", "img2tfrecord: 1/2 images"],
            ["ERROR", "img2tfrecord: error: no images"],
        ]
        for retried in (busy, crash):
            assert retried["raised"]["type"] == "AirflowException"
            assert "AirflowFailException" not in retried["raised"]["bases"]
        assert busy["raised"]["message"].startswith("img2tfrecord: error: --output_dir /x is being written")
        assert crash["raised"]["message"] == "OSError: the store is down (exit status 1: retried)"
        assert [level for level, _ in crash["lines"]] == ["ERROR"] * len(crash["lines"])
        assert bare["raised"]["type"] == "AirflowFailException"
        assert bare["raised"]["message"] == "img2tfrecord exited with status 3"
        # A Dataflow launcher: the task goes on (to wait for the job) once it is submitted.
        assert submitted["job_id"] == "2026-01-02_01_02_03-123" and submitted["raised"] is None
        assert submitted["running_after_submit"] and submitted["stopped"]

    with subtests.test("a dated run: its records, its counts as XCom"):
        run = results["dated"]
        assert _states(run) == {"convert": ("success", 1, 2), "check_summary": ("success", 1, 2)}
        command = re.search(r"Running command: (.*?) +\[airflow", log["dated"]).group(1).split()
        assert command[:4] == [sys.executable, "-m", "beam_pipeline", "--runner=DirectRunner"]
        assert "--quiet" not in command and f"--output_dir={folder[DATE]}" in command
        assert any(a.startswith("--labels=airflow-version=") for a in command)
        assert _xcom(run, "check_summary") == {
            "output_dir": folder[DATE],
            "listed": 7,
            "written": 6,
            "failed": 1,
        }
        assert _xcom(run, "convert", "started") < os.stat(Path(folder[DATE]) / "summary.json").st_mtime
        records = read_records(folder[DATE])
        assert sorted(r["filename"] for r in records) == sorted(
            f"{('cat', 'dog')[i % 2]}/{i}.png" for i in range(6)
        )
        for r in records:
            assert r["encoded"] == (data["good"] / r["filename"]).read_bytes()
            assert r["text"] == [r["filename"].split("/")[0]]

    with subtests.test("too many bad images: the task fails once, with the CLI's line"):
        run = results["too_many"]
        assert results["too_many"]["state"] == "failed"
        assert _states(run) == {
            "convert": ("failed", 1, 2),
            "check_summary": ("upstream_failed", 0, 2),
        }
        (line,) = re.findall(r"\[error +\] (img2tfrecord: error: .*?) +\[airflow", log["too_many"])
        assert "more than --max_failure_ratio 0.5" in line
        assert FAIL + line in log["too_many"]

    with subtests.test("an older dataset next to a newer aborted run: check_summary fails"):
        assert (Path(folder[DATE]) / ABORTED_FAILURES_FILE).exists()  # the kept dataset
        assert (Path(folder[DATE]) / "summary.json").exists()
        run = results["aborted"]
        assert _states(run)["check_summary"] == ("failed", 1, 2)
        assert _failure(log["aborted"]).startswith(
            f"{folder[DATE]}: a later run stopped short ({ABORTED_FAILURES_FILE}"
        )
        assert results["gs_aborted"]["error"].startswith(
            f"AirflowFailException: {gs_root}/aborted: a later run"
        )

    with subtests.test("the in-progress marker: check_summary fails"):
        assert (Path(folder["2026-01-03"]) / "summary.json").exists()  # an older dataset, being replaced
        run = results["marker"]
        assert _states(run)["check_summary"] == ("failed", 1, 2)
        assert _failure(log["marker"]) == (
            f"{folder['2026-01-03']}: no finished dataset: {MARKER_FILE} is there (a run is writing the "
            "folder, or stopped short of publishing: see its log). A finished dataset has summary.json and no marker."
        )
        assert (
            results["gs_marker"]["error"]
            == f"AirflowFailException: {gs_root}/marker: " + _failure(log["marker"]).split(": ", 1)[1]
        )

    with subtests.test("summary.json older than the run: check_summary fails; a fresh one on gs:// passes"):
        assert "is older than this run" in results["stale"]["error"]
        assert "is older than this run" in results["gs_stale"]["error"]
        assert results["gs_fresh"]["summary"] == {
            "output_dir": f"{gs_root}/fresh",
            "listed": 2000,
            "written": 2000,
            "failed": 0,
        }

    with subtests.test("a misspelt conf key is refused before anything runs"):
        run = results["misspelt"]
        assert _states(run)["convert"] == ("failed", 1, 2)
        assert _failure(log["misspelt"]).startswith("unknown conf key 'inputs' (did you mean 'input'?)")
        assert not Path(folder["2026-01-04"]).exists()

    with subtests.test("a run without a logical date: its own folder, progress lines in the task log"):
        assert no_date["state"] == "success", log["no_date"][-3000:]
        output = out_root / stamp
        assert _xcom(no_date, "check_summary") == {
            "output_dir": str(output),
            "listed": 2000,
            "written": 2000,
            "failed": 0,
        }
        assert len(read_records(output)) == 2000
        progress = re.findall(r"\[info +\] img2tfrecord: ([\d,]+)/2,000 images \(", log["no_date"])
        assert len(progress) >= 2 and progress[-1] == "2,000", progress


def _rendered(env: dict, dag_id: str, task_id: str) -> dict:
    """The task's template fields as `airflow tasks render` prints them."""
    done = subprocess.run(
        ["airflow", "tasks", "render", dag_id, task_id, DATE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    blocks = re.split(r"^# -+\n# property: (\w+)\n# -+\n", done.stdout, flags=re.M)
    return {name: value.strip() for name, value in zip(blocks[1::2], blocks[2::2])}


def _flags(options: dict) -> list[str]:
    """Beam pipeline options as the Beam provider formats them (beam_options_to_args)."""
    args = []
    for name, value in options.items():
        if value is True:
            args.append(f"--{name}")
        elif isinstance(value, list):
            args += [f"--{name}={v}" for v in value]
        elif value not in (False, None):
            args.append(f"--{name}={value}")
    return args


def _alive_descendants(root: int) -> set[int]:
    """`root` and the processes below it that are not zombies (from /proc)."""
    parent, state = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            pid = int(stat.parent.name)
            state[pid], parent[pid] = fields[0], int(fields[1])
    found, todo = set(), [root] if root in state else []
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo += [child for child, p in parent.items() if p == pid]
    return {pid for pid in found if state[pid] != "Z"}


def test_sigterm_stops_the_local_conversion_and_the_cloud_dags_render(tmp_path):
    images = tmp_path / "images"
    for i in range(4):
        write_image(images / ("cat", "dog")[i % 2] / f"{i}.png", (8, 6), seed=i)
    out_root, flag = tmp_path / "tfrecords", tmp_path / "paused"
    env = _airflow_home(
        tmp_path,
        IMG2TFRECORD_INPUT=str(images),
        IMG2TFRECORD_OUTPUT_ROOT=str(out_root),
        IMG2TFRECORD_TEST_PAUSE=f"write_shard:{flag}",  # the conversion waits for the test there
    )
    log_path = tmp_path / "dags-test.log"
    with open(log_path, "wb") as log_file:
        airflow = subprocess.Popen(
            ["airflow", "dags", "test", "img2tfrecord_local", DATE],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while not flag.exists() and airflow.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert flag.exists(), log_path.read_text()[-3000:]
        cli = json.loads((out_root / DATE_NODASH / MARKER_FILE).read_text())["pid"]
        conversion = _alive_descendants(cli)  # the CLI and its shard writers
        assert cli in conversion and airflow.pid not in conversion
        os.kill(airflow.pid, signal.SIGTERM)  # Airflow's kill of a task: SIGTERM, then on_kill
        deadline = time.monotonic() + 15
        while conversion & set().union(*map(_alive_descendants, conversion)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not conversion & set().union(*map(_alive_descendants, conversion)), (
            "the conversion outlived SIGTERM"
        )
        # The task failed and waits for its retry (dags test would wait 3 minutes for it).
        db = sqlite3.connect(tmp_path / "airflow-home" / "airflow.db")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            states = dict(db.execute("select task_id, state from task_instance"))
            if states.get("convert") == "up_for_retry":
                break
            time.sleep(0.1)
        assert states["convert"] == "up_for_retry", states
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(airflow.pid, signal.SIGKILL)
        airflow.wait()
        flag.unlink(missing_ok=True)  # a conversion that survived anyway stops waiting
    log = log_path.read_text()
    assert "Stopping img2tfrecord: SIGTERM to its process group" in log
    assert "a retry stops at the claim" in log

    # The Dataflow DAG: its command line parses with the CLI's parser.
    convert = _rendered(env, "img2tfrecord_dataflow", "convert")
    options = ast.literal_eval(convert["pipeline_options"])
    config = ast.literal_eval(convert["dataflow_config"])
    assert config == {
        "job_name": f"img2tfrecord-{DATE_NODASH}",
        "project_id": PROJECT,
        "location": "europe-west1",
        "wait_until_finished": True,
    }  # check_if_running is gone: it did nothing for the Python operator
    # What execute() and the provider add (its beam.py): project, region, job name and labels.
    provided = {"project": PROJECT, "region": "europe-west1", "job_name": config["job_name"]}
    args = ["--runner=DataflowRunner", *_flags({**options, **provided}), "--labels=airflow-version=v3-3-2"]
    check_args(args)  # every flag the operator passes is known to the CLI
    parsed = PipelineOptions(args)
    opts = parsed.view_as(ConvertOptions)
    validate(opts)
    assert opts.output_dir == f"{BUCKET}/tfrecords/{DATE_NODASH}" and opts.overwrite
    assert opts.input == f"{BUCKET}/images" and not opts.quiet
    assert parsed.view_as(GoogleCloudOptions).temp_location == f"{BUCKET}/temp"
    assert (
        parsed.view_as(GoogleCloudOptions).service_account_email
        == f"img2tfrecord-worker@{PROJECT}.iam.gserviceaccount.com"
    )
    assert parsed.view_as(WorkerOptions).sdk_container_image == (
        f"europe-west1-docker.pkg.dev/{PROJECT}/img2tfrecord/worker:0.1.0"
    )
    assert parsed.view_as(WorkerOptions).max_num_workers == 20

    # The Flex DAG: the documented `gcloud dataflow flex-template run`, parameters the template accepts.
    launch = ast.literal_eval(_rendered(env, "img2tfrecord_flex", "launch")["body"])["launchParameter"]
    assert launch["jobName"] == f"img2tfrecord-{DATE_NODASH}"
    assert launch["containerSpecGcsPath"] == f"{BUCKET}/templates/img2tfrecord.json"
    assert launch["environment"] == {
        "tempLocation": f"{BUCKET}/temp",
        "serviceAccountEmail": f"img2tfrecord-worker@{PROJECT}.iam.gserviceaccount.com",
        "maxWorkers": "20",
        "additionalExperiments": ["use_runner_v2"],
    }
    parameters = dict(launch["parameters"])
    assert (
        parameters.pop("sdk_container_image")
        == f"europe-west1-docker.pkg.dev/{PROJECT}/img2tfrecord/worker:0.1.0"
    )
    spec = json.loads((REPO / "dataflow" / "metadata.json").read_text())
    regexes = {p["name"]: p["regexes"][0] for p in spec["parameters"]}
    assert {p["name"] for p in spec["parameters"] if not p["isOptional"]} <= set(parameters)
    for name, value in parameters.items():
        assert re.fullmatch(regexes[name], value), (name, value)
    assert (
        parameters["output_dir"] == f"{BUCKET}/tfrecords/{DATE_NODASH}" and parameters["overwrite"] == "true"
    )
    assert parameters["max_failure_ratio"] == "0.5"
