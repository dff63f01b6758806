"""How long gs:// faults take to end: one object that always answers 503, and a store that dies mid-run.

    python benchmarks/gcs_faults.py                 # both cases
    python benchmarks/gcs_faults.py --images 1500 --limit 300

1. `read_with_retries` with the default RetryPolicy on an object, and on a tar member, whose
   every request is answered 503 (a local server): seconds until the ReadError, and the
   requests it made. Goal: docs/cloud.md's 5 attempts, 0.5 s doubling (~7.5-11 s), never minutes.
2. `img2tfrecord convert gs://... -> local` on the local GCS emulator (tests/gcs_emulator.py)
   (`--tar`: the images are members of one tar archive there),
   whose process is killed as soon as the run's staging folder appears (the shards are
   being written): seconds from the kill to the CLI's exit, its exit status and stderr.
   Goal: a one-line error within a minute or two (RetryPolicy.store_down is 60 s).

Both run in whole processes of this checkout (`--repo` another checkout to compare); `--limit`
stops case 2 after that many seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

_CASE_503 = """
import http.server, threading, time
from transforms.images.read import read_with_retries
from tests.gcs_emulator import emulator_env, fake_credentials
import os, pathlib, tempfile
count = [0]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        count[0] += self.path.startswith("/download/")
        self.send_response(503); self.send_header("Content-Length", "0"); self.end_headers()
    def log_message(self, *a): pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=server.serve_forever, daemon=True).start()
os.environ.update(emulator_env(server.server_address[1], fake_credentials(pathlib.Path(tempfile.mkdtemp()) / "c.json")))
start = time.monotonic()
try:
    read_with_retries(PATH)
except Exception as e:
    print(f"{time.monotonic() - start:.1f} s, {count[0]} requests: {type(e).__name__}: {str(e)[:120]}")
"""


def case_503(repo: Path, limit: float) -> None:
    for what, path in (("object", "gs://bucket/a.png"), ("tar member", "gs://bucket/a.tar#c/a.png@512+100")):
        code = f"PATH = {path!r}\n" + _CASE_503
        try:
            out = subprocess.run(
                [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=limit
            )
            print(f"503 {what}:", out.stdout.strip() or out.stderr.strip()[-500:])
        except subprocess.TimeoutExpired:
            print(f"503 {what}: still retrying after {limit:g} s")


def case_dead_store(repo: Path, images: int, limit: float, tar: bool = False) -> None:
    sys.path.insert(0, str(REPO))
    from PIL import Image

    from tests.gcs_emulator import BUCKET, start_emulator

    work = Path(tempfile.mkdtemp(prefix="gcs-faults-"))
    emulator = start_emulator(work, [BUCKET])
    env = {**os.environ, **emulator.env}
    os.environ.update(emulator.env)
    from google.cloud import storage

    bucket = storage.Client().bucket(BUCKET)
    img = work / "a.png"
    Image.new("RGB", (8, 8), (1, 2, 3)).save(img)
    data = img.read_bytes()
    if tar:  # the images as members of one archive: member reads (ranged requests)
        import io
        import tarfile

        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as t:
            for i in range(images):
                info = tarfile.TarInfo(f"c{i % 4}/{i:05d}.png")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        bucket.blob("in/set.tar").upload_from_string(buf.getvalue())
    else:
        for i in range(images):
            bucket.blob(f"in/c{i % 4}/{i:05d}.png").upload_from_string(data)
    out = work / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "beam_pipeline", "convert", "--input", f"gs://{BUCKET}/in", "--output_dir", str(out),
         "--quiet"],
        cwd=repo, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    while proc.poll() is None and not (
        out.exists() and any(n.startswith("beam-temp") for n in os.listdir(out))
    ):
        time.sleep(0.05)
    emulator.proc.kill()
    killed = time.monotonic()
    try:
        _, err = proc.communicate(timeout=limit)
        lines = err.strip().splitlines()
        print(
            f"store killed mid-run: exit {proc.returncode} {time.monotonic() - killed:.1f} s after the kill, "
            f"{len(lines)} stderr line(s); last: {lines[-1][:200] if lines else ''}"
        )
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        print(f"store killed mid-run: still running {limit:g} s after the kill")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1500)
    parser.add_argument("--limit", type=float, default=300.0, help="Seconds before a case is called hung.")
    parser.add_argument("--repo", default=str(REPO), help="Checkout whose code runs (default: this one).")
    parser.add_argument("--case", choices=("503", "dead", "both"), default="both")
    parser.add_argument("--tar", action="store_true", help="Case 2 reads the images from one tar archive.")
    args = parser.parse_args(argv)
    os.system("uptime")
    if args.case in ("503", "both"):
        case_503(Path(args.repo), args.limit)
    if args.case in ("dead", "both"):
        case_dead_store(Path(args.repo), args.images, args.limit, args.tar)
    return 0


if __name__ == "__main__":
    sys.exit(main())
