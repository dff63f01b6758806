"""PortableRunner: Beam's Python job server and a separate worker pool process, as a runner
that outlives its launcher does (no jar, no network).

The job server (`local_job_service_main`) runs the job; the worker pool
(`worker_pool_main`, `--environment_type EXTERNAL`) starts the SDK harness that runs our
steps, in its own process tree. The output must be byte-identical to the default run's, and
a launcher killed mid-job must leave the folder to its job (a rerun is refused while the job
runs, the job's steps keep the claim) until the folder holds exactly one run's complete dataset.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from beam_pipeline import main
from tests.conftest import write_image
from tests.gcs_emulator import free_port
from transforms.output.publish import MARKER_FILE
from transforms.testhooks import LEASE_ENV, PAUSE_ENV

ROOT = Path(__file__).resolve().parents[2]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server exited"
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on port {port}")


@contextlib.contextmanager
def portable_runner(
    env: dict[str, str], logs: Path, started: list[subprocess.Popen] | None = None
) -> Iterator[list[str]]:
    """Starts a job server and a worker pool (with `env`, which may set the PATH the pool finds
    `python` on), each in its own process group, added to `started` if given; yields the
    runner's flags."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **env}
    job_port, pool_port = free_port(), free_port()
    procs = []
    try:
        for module, flag, port in (
            ("apache_beam.runners.portability.local_job_service_main", "--port", job_port),
            ("apache_beam.runners.worker.worker_pool_main", "--service_port", pool_port),
        ):
            log = open(logs / f"{module.rsplit('.', 1)[1]}.log", "wb")  # noqa: SIM115 - closed with the process
            procs.append(
                (
                    subprocess.Popen(
                        [sys.executable, "-m", module, flag, str(port)],
                        cwd=ROOT,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    ),
                    log,
                )
            )
            _wait_for_port(port, procs[-1][0])
            if started is not None:
                started.append(procs[-1][0])
        yield [
            "--runner",
            "PortableRunner",
            f"--job_endpoint=localhost:{job_port}",
            "--environment_type=EXTERNAL",
            f"--environment_config=localhost:{pool_port}",
        ]
    finally:
        for proc, log in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log.close()


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("portable") / "images"
    for i in range(8):
        write_image(root / ("cat", "dog")[i % 2] / f"{i:02d}.png", (10 + i, 12), seed=i)
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n broken")
    return root


def _args(tree: Path, out: Path) -> list[str]:
    return [
        "--input",
        str(tree),
        "--output_dir",
        str(out),
        "--splits",
        "train=0.5,validation=0.5",
        "--num_shards",
        "2",
        "--max_failure_ratio",
        "0.5",
        "--quiet",
    ]


def _files(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def reference(tree, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("reference") / "out"
    assert main.main(_args(tree, out)) == main.EXIT_OK
    return _files(out)


def test_portable_runner_with_a_worker_pool_matches_the_default_run(tree, reference, tmp_path):
    out = tmp_path / "out"
    with portable_runner({}, tmp_path) as runner:
        assert main.main([*_args(tree, out), *runner]) == main.EXIT_OK
    assert _files(out) == reference


def _wait_for(condition, what: str, proc: subprocess.Popen | None = None, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.stderr.read().decode()[-3000:]}")
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.1)


def test_a_killed_launcher_leaves_the_folder_to_its_job(tree, reference, tmp_path, capsys, monkeypatch):
    """The Airflow case: the task running the launcher is killed while the job runs, and retried."""
    out, flag = tmp_path / "out", tmp_path / "paused"
    monkeypatch.setenv(LEASE_ENV, "6")  # the rerun judges the job's lease as the job beats it
    with portable_runner({PAUSE_ENV: f"write_shard:{flag}", LEASE_ENV: "6"}, tmp_path) as runner:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "beam_pipeline", "convert", *_args(tree, out), *runner],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            _wait_for(flag.exists, "reached write_shard", launcher)
        finally:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
            launcher.stderr.close()
        time.sleep(8)  # past the lease: only the job's own beats keep the claim now
        # The retry is refused while the job runs: the folder is its job's.
        assert main.main([*_args(tree, out), *runner]) == main.EXIT_USAGE
        err = capsys.readouterr().err
        assert "is being written by the job of another img2tfrecord run" in err, err
        assert not (out / "summary.json").exists() and (out / MARKER_FILE).exists()
        flag.unlink()  # the job goes on without its launcher and publishes its dataset
        _wait_for(lambda: not (out / MARKER_FILE).exists(), "published")
    assert _files(out) == reference  # exactly one run's complete dataset
    # A retry of the same command now finds the finished dataset, and --overwrite replaces it alike.
    assert main.main(_args(tree, out)) == main.EXIT_USAGE
    assert "already holds a dataset" in capsys.readouterr().err
    assert main.main([*_args(tree, out), "--overwrite"]) == main.EXIT_OK
    assert _files(out) == reference
