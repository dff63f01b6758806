"""Runs the Model Garden's TfExampleDecoder on TFRecord shards, in a subprocess with the peer folder
(`make peer`: tf-models-official without its dependencies, in .peer/) on sys.path, so the product's
own interpreter never imports it. Writes what it decoded to an .npz file.

    python tests/detection/model_garden.py OUT.npz INCLUDE_MASK SHARD...
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
PEER = REPO / ".peer"


def decode(shards: list[str], include_mask: bool, out: Path) -> list[dict]:
    """The decoder's output per record (numpy arrays; masks as uint8 arrays)."""
    if not (PEER / "official").is_dir():
        raise AssertionError(f"the Model Garden peer is not installed in {PEER}: run `make peer`")
    env = {**os.environ, "PYTHONPATH": str(PEER), "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, __file__, str(out), str(int(include_mask)), *shards]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with np.load(out, allow_pickle=False) as data:
        n = int(data["count"])
        return [{k.split("/", 1)[1]: data[k] for k in data.files if k.startswith(f"{i}/")} for i in range(n)]


def _main(out: str, include_mask: str, *shards: str) -> None:
    import tensorflow as tf
    from official.vision.dataloaders import tf_example_decoder

    decoder = tf_example_decoder.TfExampleDecoder(include_mask=bool(int(include_mask)))
    arrays = {}
    count = 0
    for raw in tf.data.TFRecordDataset(list(shards)):
        decoded = decoder.decode(raw)
        for key, value in decoded.items():
            if key != "groundtruth_instance_masks_png":
                arrays[f"{count}/{key}"] = np.asarray(value.numpy())
        count += 1
    np.savez(out, count=count, **arrays)


if __name__ == "__main__":
    _main(*sys.argv[1:])
