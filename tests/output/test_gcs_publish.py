"""Publishing many shards on gs:// (transforms/output/publish.py), against the GCS emulator.

A staged run of 250 shards (with index files) replaces a finished dataset of 300 shards:
the shards are renamed in one call of transforms/gcs.py rename_batch (GCS batch requests of
100 copies, then 100 deletes), in the documented order, and a second publish (a retried
finalize) changes nothing.
"""

from __future__ import annotations

import pytest

from tests.gcs_emulator import BUCKET
from transforms import gcs
from transforms.output.publish import MARKER_FILE, existing_files, publish

OUT = "pub/out"
STAGE = f"{OUT}/beam-temp-img2tfrecord-r1"
NEW, OLD = 250, 300


def _objects(bucket, prefix: str) -> dict[str, bytes]:
    return {
        b.name[len(prefix) + 1 :]: b.download_as_bytes()
        for b in bucket.client.list_blobs(bucket, prefix=prefix + "/")
    }


def _put(bucket, names: dict[str, bytes]) -> None:
    for name, data in names.items():
        bucket.blob(name).upload_from_string(data)


@pytest.fixture
def staged(gcs_bucket) -> list[tuple[str, str]]:
    """An old finished dataset in OUT (with the user's own file), and a new run staged in STAGE."""
    old = {f"{OUT}/train-{i:05d}-of-{OLD:05d}.tfrecord": b"old" for i in range(OLD)}
    old.update(
        {f"{OUT}/{n}": b"old" for n in ("summary.json", "labels.txt", "failures.jsonl", "features.json")}
    )
    old.update({f"{OUT}/notes.txt": b"the user's own file", f"{OUT}/{MARKER_FILE}": b"{}"})
    _put(gcs_bucket, old)
    moves, new = [], {}
    for i in range(NEW):
        temp = f"{STAGE}/train/{i:05d}-x.tfrecord"
        new[temp] = f"shard {i}".encode()
        moves.append((f"gs://{BUCKET}/{temp}", f"train-{i:05d}-of-{NEW:05d}.tfrecord"))
        if i % 2:
            new[temp + ".idx"] = f"index {i}".encode()
            moves.append((f"gs://{BUCKET}/{temp}.idx", f"train-{i:05d}-of-{NEW:05d}.tfrecord.idx"))
    for name in ("dataset_info.json", "failures.jsonl", "labels.txt", "summary.json"):
        new[f"{STAGE}/metadata/{name}"] = f"new {name}".encode()
        moves.append((f"gs://{BUCKET}/{STAGE}/metadata/{name}", name))
    _put(gcs_bucket, new)
    return moves


def _expected() -> dict[str, bytes]:
    expected = {f"train-{i:05d}-of-{NEW:05d}.tfrecord": f"shard {i}".encode() for i in range(NEW)}
    expected.update(
        {f"train-{i:05d}-of-{NEW:05d}.tfrecord.idx": f"index {i}".encode() for i in range(1, NEW, 2)}
    )
    expected.update(
        {
            n: f"new {n}".encode()
            for n in ("dataset_info.json", "failures.jsonl", "labels.txt", "summary.json")
        }
    )
    return {**expected, "notes.txt": b"the user's own file"}


def test_many_shards_are_published_at_once_in_order(gcs_bucket, staged, monkeypatch):
    calls: list[list[str]] = []
    rename = gcs.rename_batch

    def spy(pairs: list[tuple[str, str]]) -> None:
        calls.append([d.rsplit("/", 1)[1] for _, d in pairs])
        rename(pairs)

    monkeypatch.setattr(gcs, "rename_batch", spy)
    publish(f"gs://{BUCKET}/{OUT}", staged)
    # Old shards, features.json (not produced by this run) and the marker gone; staging emptied.
    assert _objects(gcs_bucket, OUT) == _expected()
    # Three steps: every shard, index and reader file at once, then failures.jsonl and
    # labels.txt, summary.json last.
    assert [len(c) for c in calls] == [NEW + NEW // 2 + 1, 2, 1]
    assert calls[1:] == [["failures.jsonl", "labels.txt"], ["summary.json"]]

    calls.clear()
    publish(f"gs://{BUCKET}/{OUT}", staged)  # a retried finalize: everything already in place
    assert _objects(gcs_bucket, OUT) == _expected() and calls == []

    gcs_bucket.blob(f"{OUT}/labels.txt").delete()
    with pytest.raises(FileNotFoundError, match="labels.txt was never published"):
        publish(f"gs://{BUCKET}/{OUT}", staged)


def test_existing_files_lists_each_folder_once(gcs_bucket, staged):
    paths = [staged_path for staged_path, _ in staged]
    missing = [f"gs://{BUCKET}/{STAGE}/train/99999-x.tfrecord", f"gs://{BUCKET}/{STAGE}/nowhere/a"]
    assert existing_files(paths + missing) == set(paths)
