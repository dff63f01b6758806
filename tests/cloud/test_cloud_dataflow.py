"""The Dataflow submission path, offline: Beam's own DataflowRunner against local servers.

With `--dataflow_endpoint` pointing at a tiny local HTTP server, Beam's own client builds the
job exactly as for a real submission (the portable pipeline proto and the `--setup_file`
sdist, staged into a bucket on the local GCS emulator) and sends the real create-job request
there. (Classic templates, `--template_location`, are refused: tests/cli/test_remote_runner.py.)
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import tarfile
import threading
import typing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from apache_beam.portability.api import beam_runner_api_pb2

from beam_pipeline import main
from beam_pipeline.cli.options import UserError
from tests.conftest import write_image
from tests.gcs_emulator import BUCKET, upload_tree
from transforms import records as records_module
from transforms.failures import Failure

GBK_URN = "beam:transform:group_by_key:v1"
# The steps of the diagram in pipeline.py.
STEPS = ["ListImages", "LabelFromFolders", "AssignSplits", "PlanShards", "WriteShards", "WriteMetadata"]
IMAGE = "europe-docker.pkg.dev/my-project/img2tfrecord/worker:0.1.0"
REPO = Path(__file__).resolve().parents[2]


def _dataflow_args(name: str, n_images: int) -> list[str]:
    return [
        "--input",
        f"gs://{BUCKET}/df-in-{n_images}",
        "--output_dir",
        f"gs://{BUCKET}/df-out-{name}",
        "--runner",
        "DataflowRunner",
        "--project",
        "my-project",
        "--region",
        "europe-west1",
        "--temp_location",
        f"gs://{BUCKET}/temp",
        "--staging_location",
        f"gs://{BUCKET}/staging-{name}",
        "--splits",
        "train=0.8,validation=0.2",
        "--quiet",
    ]


@dataclasses.dataclass
class Described:
    """What one submission sent to the Dataflow API and left in the bucket."""

    template: dict  # the create-job request: the job description a template would hold
    pipeline: beam_runner_api_pb2.Pipeline
    staged: dict[str, bytes]  # file name -> content


def _describe(bucket, endpoint: str, name: str, n_images: int, extra: list[str]) -> Described:
    FakeDataflowHandler.requests = []
    args = _dataflow_args(name, n_images) + [f"--dataflow_endpoint={endpoint}"]
    # The fake job ran nothing, so there is no summary.
    with pytest.raises(UserError, match="without writing summary.json"):
        main.run(args + extra, save_main_session=False)
    (template,) = [body for verb, _, body in FakeDataflowHandler.requests if verb == "POST"]
    staged = {
        b.name.rsplit("/", 1)[1]: b.download_as_bytes()
        for b in bucket.client.list_blobs(bucket, prefix=f"staging-{name}/")
    }
    pipeline = beam_runner_api_pb2.Pipeline.FromString(staged["pipeline.pb"])
    return Described(template, pipeline, staged)


@pytest.fixture(scope="module")
def inputs(gcs_bucket, tmp_path_factory):
    """gs://BUCKET/df-in-3 and df-in-60: that many tiny images in three classes."""
    local = tmp_path_factory.mktemp("df")
    for n in (3, 60):
        for i in range(n):
            write_image(local / f"in{n}" / f"class{i % 3}" / f"{i}.png", (4, 4), seed=i)
        upload_tree(gcs_bucket, local / f"in{n}", f"df-in-{n}")
    return gcs_bucket


def test_templates_from_dataflow_runner(described):
    """One test over both template builds (so that parallel test workers build them once)."""
    _check_graph_has_the_diagram_steps_and_no_listing(described)
    _check_no_image_bytes_reach_a_group_by_key(described)
    _check_setup_file_sdist_is_staged_with_both_packages(described)
    _check_custom_container_image_is_carried(described)


@pytest.fixture(scope="module")
def dataflow_api():
    """The URL of a local fake of the Dataflow API (FakeDataflowHandler)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeDataflowHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def described(inputs, dataflow_api) -> dict[str, Described]:
    """Two jobs: 3 images with --setup_file, 60 images with the custom container."""
    gcs_bucket = inputs
    return {
        "setup_file": _describe(
            gcs_bucket, dataflow_api, "setup", 3, ["--setup_file", str(REPO / "setup.py")]
        ),
        "container": _describe(gcs_bucket, dataflow_api, "container", 60, ["--sdk_container_image", IMAGE]),
    }


def _transforms(p: beam_runner_api_pb2.Pipeline) -> dict[str, beam_runner_api_pb2.PTransform]:
    return dict(p.components.transforms)


def _check_graph_has_the_diagram_steps_and_no_listing(described):
    for d in described.values():
        transforms = _transforms(d.pipeline)
        top = [transforms[t].unique_name for t in _top_level(d.pipeline)]
        assert set(STEPS) <= set(top), top
        payloads = b"".join(t.SerializeToString() for t in transforms.values())
        assert b"df-in-3/class0/0.png" not in payloads and b"/0.png" not in payloads

    # The graph is the same whatever the number of input files (3 vs 60): listing is a step.
    small, large = (described[k].pipeline for k in ("setup_file", "container"))
    assert sorted(t.unique_name for t in _transforms(small).values()) == sorted(
        t.unique_name for t in _transforms(large).values()
    )
    size = {k: sum(t.ByteSize() for t in _transforms(d.pipeline).values()) for k, d in described.items()}
    # Only the file names in the pickled DoFns differ (input/output prefixes, run id).
    assert abs(size["setup_file"] - size["container"]) < 200, size


def _top_level(p: beam_runner_api_pb2.Pipeline) -> list[str]:
    """Ids of the pipeline's own steps (below the single wrapper root, if there is one)."""
    roots = list(p.root_transform_ids)
    while len(roots) == 1 and p.components.transforms[roots[0]].subtransforms:
        roots = list(p.components.transforms[roots[0]].subtransforms)
    return roots


def _upstream(p: beam_runner_api_pb2.Pipeline, pcoll: str) -> set[tuple[str, str]]:
    """Every (producer transform, output tag) edge that feeds `pcoll`, transitively (leaf steps)."""
    transforms = _transforms(p)
    producer = {
        out: (tid, tag)
        for tid, t in transforms.items()
        if not t.subtransforms
        for tag, out in t.outputs.items()
    }
    seen: set[tuple[str, str]] = set()
    todo = [pcoll]
    while todo:
        edge = producer.get(todo.pop())
        if edge is None or edge in seen:
            continue
        seen.add(edge)
        todo.extend(transforms[edge[0]].inputs.values())
    return {(transforms[tid].unique_name, tag) for tid, tag in seen}


# Fields of bytes that are not image bytes: a RecordBatch's seeded hashes (16 bytes a record).
_NOT_IMAGE_BYTES = {(records_module.RecordBatch, "hashes")}


def _fields_hold_bytes(cls: type) -> bool:
    if dataclasses.is_dataclass(cls):
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
    else:  # a batch of columns: its fields are the arguments of from_columns (or of the constructor)
        hints = typing.get_type_hints(getattr(cls, "from_columns", cls.__init__))
        names = [name for name in hints if name != "return"]
    return any("bytes" in str(hints[n]) for n in names if (cls, n) not in _NOT_IMAGE_BYTES)


def _check_no_image_bytes_reach_a_group_by_key(described):
    p = described["setup_file"].pipeline
    transforms = _transforms(p)
    gbks = [t for t in transforms.values() if t.spec.urn == GBK_URN]
    assert any(t.unique_name.startswith("PlanShards/") for t in gbks)  # the metadata shuffle
    for gbk in gbks:
        (source,) = gbk.inputs.values()
        upstream = _upstream(p, source)
        writes = {(name, tag) for name, tag in upstream if name.startswith("WriteShards/")}
        # Nothing of the one step that reads image bytes ever reaches a shuffle, but for the
        # metadata step's lifted counts (of ShardResults and Failures) and its sorted parts of Failures
        # (neither type has a bytes field: checked below).
        if gbk.unique_name.startswith(("WriteMetadata/Count", "WriteMetadata/GroupFailures")):
            continue
        assert not writes, (gbk.unique_name, writes)
    # ... and no record type that travels between steps has a bytes field.
    for cls in (
        records_module.ImageFile,
        records_module.ImageRecord,
        records_module.FileBatch,
        records_module.RecordBatch,
        records_module.ShardTask,
        records_module.ShardResult,
        Failure,
    ):
        assert not _fields_hold_bytes(cls), cls


def _check_setup_file_sdist_is_staged_with_both_packages(described):
    d = described["setup_file"]
    env = next(iter(d.pipeline.components.environments.values()))
    assert b"gcr.io/cloud-dataflow/v1beta3/beam_python3.11_sdk:2.77.0" in env.payload
    packages = {p["name"] for p in d.template["environment"]["workerPools"][0]["packages"]}
    assert "workflow.tar.gz" in packages
    with tarfile.open(fileobj=io.BytesIO(d.staged["workflow.tar.gz"])) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    # Every module of both packages ships (a module missing from setup.py breaks only workers).
    for package in ("beam_pipeline", "transforms"):
        modules = {f"{package}/{f.name}" for f in (REPO / package).glob("*.py")}
        assert modules and modules <= names, sorted(modules - names)
    options = d.template["environment"]["sdkPipelineOptions"]["options"]
    assert options["setup_file"].endswith("setup.py")
    assert options["input"] == f"gs://{BUCKET}/df-in-3"


def _check_custom_container_image_is_carried(described):
    d = described["container"]
    env = next(iter(d.pipeline.components.environments.values()))
    assert IMAGE.encode() in env.payload
    pool = d.template["environment"]["workerPools"][0]
    assert pool["workerHarnessContainerImage"] == IMAGE
    assert [c["containerImage"] for c in pool["sdkHarnessContainerImages"]] == [IMAGE]
    assert "workflow.tar.gz" not in {p["name"] for p in pool.get("packages", [])}


def test_dry_run_describes_without_writing(inputs, capsys):
    gcs_bucket = inputs
    code = main.main(["convert"] + _dataflow_args("dry", 3) + ["--dry_run=True", "--no_auth"])
    assert code == main.EXIT_OK
    assert "not run" in capsys.readouterr().err
    assert not list(gcs_bucket.client.list_blobs(gcs_bucket, prefix="df-out-dry"))
    assert not list(gcs_bucket.client.list_blobs(gcs_bucket, prefix="staging-dry"))


# How Airflow's Dataflow hook finds the job id in the submitting process's output
# (airflow/providers/google/cloud/hooks/dataflow.py, JOB_ID_PATTERN).
AIRFLOW_JOB_ID_PATTERN = re.compile(
    r"Submitted job: (?P<job_id_java>[^\"\n\s]*)|Created job with id: \[(?P<job_id_python>[^\"\n\s]*)\]"
)


class FakeDataflowHandler(BaseHTTPRequestHandler):
    """Accepts a job creation and reports the job as done; records every request."""

    requests: list[tuple[str, str, dict]] = []

    def _reply(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.requests.append((self.command, self.path.split("?")[0], body))
        if self.command == "POST" and self.path.split("?")[0].endswith("/jobs"):
            reply = {**body, "id": "fake-job-1", "currentState": "JOB_STATE_PENDING"}
        elif "/messages" in self.path:
            reply = {}
        else:
            reply = {"id": "fake-job-1", "currentState": "JOB_STATE_DONE"}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = _reply

    def log_message(self, *args) -> None:
        pass


def test_submission_reaches_the_dataflow_api(inputs, dataflow_api, capsys, caplog):
    FakeDataflowHandler.requests = []
    args = _dataflow_args("submit", 3) + [
        f"--dataflow_endpoint={dataflow_api}",
        "--sdk_container_image",
        IMAGE,
        "--labels",
        "team=ml",
    ]
    code = main.main(["convert"] + args)
    (create,) = [body for verb, path, body in FakeDataflowHandler.requests if verb == "POST"]
    assert create["labels"] == {"team": "ml"}
    pool = create["environment"]["workerPools"][0]
    assert pool["sdkHarnessContainerImages"][0]["containerImage"] == IMAGE
    options = create["environment"]["sdkPipelineOptions"]["options"]
    assert options["input"] == f"gs://{BUCKET}/df-in-3" and options["pipelineUrl"].startswith(
        f"gs://{BUCKET}/"
    )
    # A scheduler learns the job id from the CLI's log.
    found = AIRFLOW_JOB_ID_PATTERN.search(caplog.text)
    assert found and found.group("job_id_python") == "fake-job-1"
    # The fake job ran nothing, so there is no summary: one line, exit 2, no traceback.
    assert code == main.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == "img2tfrecord: error: the job finished without writing summary.json"
