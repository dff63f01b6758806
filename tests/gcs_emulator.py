"""A local GCS server (gcp-storage-emulator) for tests, in its own process.

`python -m tests.gcs_emulator PORT BUCKET...` serves an in-memory store on 127.0.0.1:PORT
and prints "ready" once it accepts requests. `start_emulator()` does that and sets the
environment Beam's and google-cloud-storage's clients need to talk to it.

Quirks and gaps of the emulator are handled here:
  - In memory mode it still serialises its whole object table to a ".meta" file on every
    upload, which makes uploads O(objects); that write is disabled (memory mode never reads it back).
  - Its object listing returns everything in one response; here it pages as GCS does (at most
    `maxResults` and PAGE_SIZE entries, objects and prefixes together, in name order, with a
    `nextPageToken`), so listings of more than PAGE_SIZE objects take several requests.
  - Google's clients try default credentials (with retries, ~23 s per process) unless
    GOOGLE_APPLICATION_CREDENTIALS names a credentials file; a fake `authorized_user`
    file with a far-future access token makes them send it without any refresh.
  - It ignores the `ifGenerationMatch` precondition of uploads, patches and deletes;
    `_with_preconditions` checks it (412 on a mismatch; 0 means "must not exist"), one
    request at a time, as GCS does. It also serves the live object whatever `generation` a
    read names; `_pinned` answers 404 for another generation, as a bucket without versioning does.
"""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time
from http import HTTPStatus
from pathlib import Path

HOST = "127.0.0.1"
# The bucket the `gcs_bucket` fixture (conftest.py) creates.
BUCKET = "img2tfrecord-test"
# Entries in one page of an object listing: GCS's default and maximum.
PAGE_SIZE = 1000


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def fake_credentials(path: Path) -> Path:
    """Writes an `authorized_user` credentials file whose token never needs refreshing."""
    path.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "img2tfrecord-test",
                "client_secret": "not-a-secret",
                "refresh_token": "not-a-token",
                "token": "fake-access-token",
                "expiry": "2999-01-01T00:00:00Z",
            }
        )
    )
    return path


def emulator_env(port: int, credentials: Path) -> dict[str, str]:
    """Environment variables that point Google's storage clients at the emulator."""
    return {
        "STORAGE_EMULATOR_HOST": f"http://{HOST}:{port}",  # the scheme is required
        "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
        "GOOGLE_CLOUD_PROJECT": "img2tfrecord-test",
        "NO_GCE_CHECK": "true",
    }


class Emulator:
    """A running emulator process; `env` holds the variables that reach it."""

    def __init__(self, proc: subprocess.Popen, port: int, env: dict[str, str]):
        self.proc, self.port, self.env = proc, port, env

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def start_emulator(workdir: Path, buckets: list[str], timeout: float = 30.0) -> Emulator:
    """Starts the emulator on a free port with `buckets` created (does not touch os.environ)."""
    port = free_port()
    env = emulator_env(port, fake_credentials(workdir / "fake-adc.json"))
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.gcs_emulator", str(port), *buckets],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        proc.kill()
        raise RuntimeError(f"gcs emulator did not start within {timeout:g} s (got {line!r})")
    return Emulator(proc, port, env)


class FaultProxy:
    """An HTTP proxy in front of a store (the emulator) that answers chosen requests itself.

    `fault(method, path, body)` returns an HTTP status to answer with (nothing forwarded),
    or None to forward the request and relay the answer. Point a client at `url` (e.g.
    STORAGE_EMULATOR_HOST) to inject faults into some requests only, e.g. the uploads of a
    run's staged shards after its claim went through. `faulted` counts the answered ones.
    """

    def __init__(self, upstream: str, fault):
        import http.client
        import http.server
        import threading
        from urllib.parse import urlsplit

        target = urlsplit(upstream)
        self.faulted = 0
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status = fault(self.command, self.path, body)
                if status is not None:
                    proxy.faulted += 1
                    data = json.dumps({"error": {"code": status, "message": "injected fault"}}).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                else:
                    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                    headers = {
                        k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")
                    }
                    conn.request(self.command, self.path, body=body, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                    self.send_response(answer.status)
                    for key, value in answer.getheaders():
                        if key.lower() not in (
                            "content-length",
                            "transfer-encoding",
                            "connection",
                            "date",
                            "server",
                        ):
                            self.send_header(key, value)
                    conn.close()
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay

            def log_message(self, *args) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def upload_tree(bucket, local: Path, prefix: str) -> list[str]:
    """Uploads every file below `local` to `prefix/<relative path>`."""
    names = []
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        name = f"{prefix}/{path.relative_to(local).as_posix()}"
        bucket.blob(name).upload_from_filename(str(path))
        names.append(name)
    return names


def download_prefix(bucket, prefix: str, dest: Path) -> list[str]:
    """Every object below `prefix/` into `dest`; returns their names relative to the prefix."""
    names = []
    for blob in bucket.client.list_blobs(bucket, prefix=prefix + "/"):
        rel = blob.name[len(prefix) + 1 :]
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        blob.download_to_filename(str(dest / rel))
        names.append(rel)
    return sorted(names)


def _paged_list(request, response, storage, *args, **kwargs) -> None:
    """objects.list as GCS pages it: entries (objects and prefixes) in name order, at most
    `maxResults` (and PAGE_SIZE) a page, the next page starting after `pageToken`."""
    from gcp_storage_emulator.exceptions import BadRequest, NotFound

    def arg(name: str) -> str | None:
        values = request.query.get(name)
        return values[0] if values else None

    try:
        items, prefixes = storage.get_file_list(
            request.params["bucket_name"],
            arg("prefix"),
            arg("delimiter"),
            arg("matchGlob"),
            soft_deleted=(arg("softDeleted") or "").lower() in ("1", "true", "yes"),
        )
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    except BadRequest:
        response.status = HTTPStatus.BAD_REQUEST
        return
    entries = sorted(
        [(item["name"], item) for item in items] + [(p, None) for p in prefixes], key=lambda e: e[0]
    )
    token = arg("pageToken")
    if token:
        entries = [e for e in entries if e[0] > token]
    size = min(int(arg("maxResults") or PAGE_SIZE), PAGE_SIZE)
    page = entries[:size]
    body = {
        "kind": "storage#objects",
        "items": [item for _, item in page if item is not None],
        "prefixes": [name for name, item in page if item is None],
    }
    if len(entries) > size:
        body["nextPageToken"] = page[-1][0]
    response.json(body)


def _with_preconditions(handler, storage_lock):
    """`handler` (an emulator object handler) that first checks `ifGenerationMatch`."""
    from http import HTTPStatus

    from gcp_storage_emulator.exceptions import NotFound

    def checked(request, response, storage, *args, **kwargs):
        wanted = request.query.get("ifGenerationMatch")
        if not wanted:
            return handler(request, response, storage, *args, **kwargs)
        bucket = request.params["bucket_name"]
        name = request.params.get("object_id") or (request.query.get("name") or [None])[0]
        if name is None and isinstance(request.data, dict):  # a multipart upload names it inside
            name = request.data["meta"].get("name")
        with storage_lock:
            try:
                generation = storage.get_file_obj(bucket, name)["generation"]
            except NotFound:
                generation = "0"
            if str(generation) != wanted[0]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "conditionNotMet", "errors": []}})
                return None
            return handler(request, response, storage, *args, **kwargs)

    return checked


def _pinned(handler, storage_lock):
    """`handler` (an object read) that answers 404 when `generation` names another generation
    than the live one (GCS without versioning keeps only the live one; the emulator ignores it)."""
    from http import HTTPStatus

    from gcp_storage_emulator.exceptions import NotFound

    def checked(request, response, storage, *args, **kwargs):
        wanted = request.query.get("generation")
        if wanted:
            try:
                with storage_lock:
                    live = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            except NotFound:
                live = {}
            if str(live.get("generation")) != wanted[0]:
                response.status = HTTPStatus.NOT_FOUND
                response.json({"error": {"code": 404, "message": "No such object generation", "errors": []}})
                return None
        return handler(request, response, storage, *args, **kwargs)

    return checked


def _serve(port: int, buckets: list[str]) -> None:
    import threading

    from gcp_storage_emulator import server as server_module
    from gcp_storage_emulator import storage
    from gcp_storage_emulator.handlers import buckets as bucket_handlers
    from gcp_storage_emulator.handlers import objects
    from gcp_storage_emulator.server import create_server

    for _, handlers in server_module.HANDLERS:
        if handlers.get("GET") is objects.ls:
            handlers["GET"] = _paged_list

    original = storage.Storage._write_config_to_file

    def write_config(self) -> None:
        if not self._use_memory_fs:
            original(self)

    storage.Storage._write_config_to_file = write_config
    lock = threading.Lock()
    guarded = {objects.insert, objects.patch, objects.delete}
    pinned = {objects.download, objects.get}

    def wrapped(h):
        return _with_preconditions(h, lock) if h in guarded else _pinned(h, lock) if h in pinned else h

    server_module.HANDLERS = tuple(
        (regex, {m: wrapped(h) for m, h in handlers.items()}) for regex, handlers in server_module.HANDLERS
    )
    objects.insert = _with_preconditions(objects.insert, lock)  # uploads posted without /upload
    server = create_server(HOST, port, in_memory=True)
    for bucket in buckets:
        bucket_handlers.create_bucket(bucket, server._storage)
    server.start()
    print("ready", flush=True)
    parent = os.getppid()
    try:
        while os.getppid() == parent:  # exits with the test process, even one that crashed
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    os.environ.pop("STORAGE_EMULATOR_HOST", None)
    _serve(int(sys.argv[1]), sys.argv[2:])
