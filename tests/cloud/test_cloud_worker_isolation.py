"""Workers that have only what setup.py ships: Beam's worker pool in a venv built like the container.

An in-process run imports the project from the working tree, so a module missing from the
package (or anything read from the submitting machine's files or main session) goes unnoticed
until Dataflow. Here the SDK harness runs from a separate venv, with the sdist installed and the
working tree out of reach (another cwd), and the pipeline reaches it as an EXTERNAL environment.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms.environments import ExternalEnvironment

from beam_pipeline.cli.options import ConvertOptions
from beam_pipeline.pipeline import build_pipeline
from tests.conftest import read_records
from tests.gcs_emulator import free_port
from transforms.output.claim import claim_output
from transforms.output.fence import Fence

REPO = Path(__file__).resolve().parents[2]
UV = str(Path(sys.executable).parent / "uv")


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"worker pool did not listen on port {port}")


@pytest.fixture(scope="module")
def worker_pool(tmp_path_factory):
    """`worker_pool_main` from a fresh venv holding only the project's sdist and its requirements."""
    root = tmp_path_factory.mktemp("isolated")
    subprocess.run(
        [UV, "build", "-q", "--sdist", "-o", str(root / "dist"), str(REPO)], check=True, timeout=300
    )
    (sdist,) = (root / "dist").glob("img2tfrecord-*.tar.gz")
    subprocess.run(
        [UV, "venv", "-q", "--python", sys.executable, str(root / "venv")], check=True, timeout=300
    )
    python = root / "venv" / "bin" / "python"
    subprocess.run([UV, "pip", "install", "-q", "--python", str(python), str(sdist)], check=True, timeout=600)
    port = free_port()
    env = {
        **os.environ,
        "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}",
    }  # the pool starts `python`
    env.pop("PYTHONPATH", None)
    pool = subprocess.Popen(
        [str(python), "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"],
        cwd=root,
        env=env,
    )
    _wait_for_port(port, pool)
    yield f"localhost:{port}"
    pool.terminate()
    pool.wait(timeout=30)


def test_pipeline_runs_on_isolated_workers(worker_pool, image_tree, tmp_path):
    out = tmp_path / "out"
    options = PipelineOptions(
        ["--input", str(image_tree), "--output_dir", str(out), "--splits", "train=0.5,test=0.5"]
    )
    runner = FnApiRunner(default_environment=ExternalEnvironment(worker_pool))
    p = beam.Pipeline(runner=runner, options=options)
    claim = claim_output(str(out), False, "isolated")  # publishing is fenced by the claim's token
    try:
        build_pipeline(p, options.view_as(ConvertOptions), claim.run_id, fence=Fence.of(claim))
        p.run().wait_until_finish()
    finally:
        claim.release()
    records = read_records(out, "train") + read_records(out, "test")
    assert sorted(r["filename"] for r in records) == sorted(
        p.relative_to(image_tree).as_posix()
        for p in image_tree.rglob("*")
        if p.suffix.lower() != ".txt" and p.is_file()
    )
    for r in records:
        assert r["encoded"] == (image_tree / r["filename"]).read_bytes()
