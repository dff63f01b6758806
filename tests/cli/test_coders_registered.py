"""Every record of ours that crosses a stage boundary is coded by our coders, never pickled.

Beam looks a PCollection's coder up by its element type; a record type without a registered coder
goes to FastPrimitivesCoder's fallback, PickleCoder, silently (right, but ~2 us a record and the
class path in every element). The coders are registered where the graph is built
(beam_pipeline/pipeline.py `register_coders`). Each case converts in a fresh interpreter (nothing
registered by an earlier test) with `pickle.dumps`, which PickleCoder calls, recording the types
of ours it is handed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import write_image

# Types of ours that are pickled, not per image: their count does not grow with the images.
PICKLED_ON_PURPOSE = {
    "ClassIndex": "the class names, one side input a run",
    "ShardResult": "one a written shard",
}

_RUN = """
import json, pickle, sys

pickled = set()
dumps = pickle.dumps

def recording_dumps(value, *args, **kwargs):
    if type(value).__module__.startswith(("transforms", "beam_pipeline")):
        pickled.add(type(value).__qualname__)
    return dumps(value, *args, **kwargs)

pickle.dumps = recording_dumps
from beam_pipeline.main import run

summary = run(json.loads(sys.argv[1]), save_main_session=False)
print(json.dumps({"pickled": sorted(pickled), "written": summary["written"]}))
"""


def _pickled_types(argv: list[str]) -> tuple[list[str], int]:
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(argv)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    return seen["pickled"], seen["written"]


@pytest.mark.parametrize("labels", ["folders", "table"])
def test_no_record_of_ours_is_pickled_between_stages(tmp_path, labels):
    images = tmp_path / "in"
    for i in range(12):
        write_image(images / f"c{i % 3}" / f"{i}.png", (8 + i, 8), seed=i)
    argv = ["--input", str(images), "--output_dir", str(tmp_path / "out"), "--write_processes", "1"]
    argv += ["--splits", "train=0.5,test=0.5", "--stratify", "--quiet"]
    if labels == "table":
        table = tmp_path / "labels.csv"
        rows = [f"c{i % 3}/{i}.png,l{i % 2}" for i in range(12)] + ["gone.png,l0"]  # an orphan row too
        table.write_text("file,label\n" + "\n".join(rows) + "\n")
        argv += ["--labels", str(table), "--image_key", "relpath", "--key_column", "file"]
    pickled, written = _pickled_types(argv)
    assert written == 12
    assert set(pickled) <= set(PICKLED_ON_PURPOSE)
