"""Nothing under --input is skipped without a word: what the listing does not read is counted by
reason in summary.json and in the final line, and JPEG/AVIF/HEIC names are read (issue 33).

A local folder, a tar archive and a folder of many odd extensions go through the CLI
(`main.main`) and are read back from summary.json, failures.jsonl and the shards. The gs://
listing's counts are checked against the local ones in tests/listing/test_gcs_listing.py.
"""

from __future__ import annotations

import io
import json
import random
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from beam_pipeline import main
from tests.conftest import read_records, write_image

# The first bytes of a HEIC photo (an ISO base media `ftyp` box, brand heic): enough for the
# format to be told, and a file no decoder here can read without the pillow-heif plugin.
HEIC_HEADER = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + bytes(64)


def _mixed_folder(root: Path) -> Path:
    """cat/: a .jpg, a .jfif, a .jpe; dog/: a .png, an .avif, a .heic; beside them what is not
    an image: notes, a README, macOS and notebook leftovers."""
    write_image(root / "cat" / "a.jpg", (20, 10), fmt="JPEG", seed=1)
    write_image(root / "cat" / "b.jfif", (20, 10), fmt="JPEG", seed=2)
    write_image(root / "cat" / "c.JPE", (20, 10), fmt="JPEG", seed=3)
    write_image(root / "dog" / "d.png", (16, 12), seed=4)
    Image.new("RGB", (18, 14), (0, 200, 0)).save(root / "dog" / "e.avif")
    (root / "dog" / "f.heic").write_bytes(HEIC_HEADER)
    (root / "dog" / "notes.txt").write_text("not an image")
    (root / "cat" / "labels.csv").write_text("a,cat\n")
    (root / "README").write_text("about the data")
    (root / ".DS_Store").write_bytes(b"\0")
    write_image(root / "cat" / ".ipynb_checkpoints" / "a-checkpoint.jpg", fmt="JPEG")
    write_image(root / "cat" / ".ipynb_checkpoints" / "b-checkpoint.jpg", fmt="JPEG")
    return root


def _run(argv: list[str], capsys) -> tuple[int, list[str]]:
    status = main.main([*argv, "--quiet"])
    return status, capsys.readouterr().err.splitlines()


def test_files_not_read_are_counted_by_reason_in_the_summary_and_the_final_line(tmp_path, capsys):
    data, out = _mixed_folder(tmp_path / "in"), tmp_path / "out"
    status, err = _run(["--input", str(data), "--output_dir", str(out), "--max_failure_ratio", "0.5"], capsys)
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] == {
        "total": 5,
        "hidden": 2,  # .DS_Store and the checkpoint folder (once, with what it holds)
        "by_extension": {"(none)": 1, ".csv": 1, ".txt": 1},
    }
    assert err[-1] == (
        "img2tfrecord: wrote 5 of 6 images (1 failed, see failures.jsonl); "
        "skipped 2 hidden entries and 3 files by extension: (none) 1, .csv 1, .txt 1"
    )
    # .jfif and .jpe are JPEG names: their bytes are kept; AVIF is converted as --image_format
    # keep converts what TensorFlow cannot decode (PNG); HEIC without a decoder fails by name.
    records = {r["filename"]: r for r in read_records(out)}
    assert {name: r["format"] for name, r in records.items()} == {
        "cat/a.jpg": "jpeg",
        "cat/b.jfif": "jpeg",
        "cat/c.JPE": "jpeg",
        "dog/d.png": "png",
        "dog/e.avif": "png",
    }
    assert records["cat/b.jfif"]["decoded_shape"] == (10, 20, 3)
    assert records["dog/e.avif"]["decoded_shape"] == (14, 18, 3)
    (failure,) = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    assert failure["path"].endswith("f.heic") and failure["stage"] == "decode"
    assert (
        failure["reason"].startswith("HEIC/HEIF image: ") and "pip install pillow-heif" in failure["reason"]
    )


def test_avif_follows_the_image_format_rule(tmp_path, capsys):
    data, out = tmp_path / "in", tmp_path / "out"
    (data / "cat").mkdir(parents=True)
    Image.new("RGB", (18, 14), (0, 200, 0)).save(data / "cat" / "e.avif")
    status, err = _run(["--input", str(data), "--output_dir", str(out), "--image_format", "jpeg"], capsys)
    assert status == 0, err
    (record,) = read_records(out)
    assert record["format"] == "jpeg" and record["decoded_shape"] == (14, 18, 3)
    assert err[-1] == "img2tfrecord: wrote 1 of 1 images (none failed)"  # nothing skipped, nothing said
    skipped = json.loads((out / "summary.json").read_text())["skipped"]
    assert skipped == {"total": 0, "hidden": 0, "by_extension": {}}


def test_heic_converts_when_the_pillow_heif_plugin_is_installed(tmp_path, capsys):
    pillow_heif = pytest.importorskip("pillow_heif")
    data, out = tmp_path / "in", tmp_path / "out"
    (data / "cat").mkdir(parents=True)
    pillow_heif.from_pillow(Image.new("RGB", (20, 10), (200, 0, 0))).save(data / "cat" / "a.heic")
    status, err = _run(["--input", str(data), "--output_dir", str(out)], capsys)
    assert status == 0, err
    (record,) = read_records(out)
    assert record["format"] == "png" and record["decoded_shape"] == (10, 20, 3)


def test_tar_members_that_are_not_images_are_counted(tmp_path, capsys):
    archive, out = tmp_path / "shards" / "images_000.tar", tmp_path / "out"
    archive.parent.mkdir()
    with tarfile.open(archive, "w") as t:
        for name, data in (
            ("cat/1.jpg", _jpeg(1)),
            ("cat/1.json", b'{"caption": "a cat"}'),
            ("cat/2.jfif", _jpeg(2)),
            ("dog/3.jpg", _jpeg(3)),
            ("dog/3.txt", b"a dog"),
            ("LICENSE", b"CC-BY"),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        info = tarfile.TarInfo("dog")  # a folder entry is no file: not counted
        info.type = tarfile.DIRTYPE
        t.addfile(info)
    status, err = _run(["--input", str(archive), "--output_dir", str(out)], capsys)
    assert status == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["written"] == 3
    assert summary["skipped"] == {
        "total": 3,
        "hidden": 0,
        "by_extension": {"(none)": 1, ".json": 1, ".txt": 1},
    }
    assert err[-1].endswith("; skipped 3 files by extension: (none) 1, .json 1, .txt 1")


def _jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8 + seed, 8), (seed * 40, 0, 0)).save(buf, "JPEG")
    return buf.getvalue()


def test_the_extension_counts_are_bounded_and_exact(tmp_path, capsys):
    """A folder of `x.000` ... `x.079` (80 extensions): MAX_EXTENSIONS are named, the rest
    counted under OTHER, the same whatever the order the counts are merged in."""
    from transforms.listing.skips import MAX_EXTENSIONS, OTHER, add_counts

    data, out = tmp_path / "in", tmp_path / "out"
    write_image(data / "cat" / "a.png")
    for i in range(80):
        (data / "cat" / f"x.{i:03d}").write_bytes(b"")
    status, err = _run(["--input", str(data), "--output_dir", str(out)], capsys)
    assert status == 0, err
    skipped = json.loads((out / "summary.json").read_text())["skipped"]
    named = {f".{i:03d}": 1 for i in range(MAX_EXTENSIONS)}
    assert skipped == {"total": 80, "hidden": 0, "by_extension": {**named, OTHER: 80 - MAX_EXTENSIONS}}
    assert err[-1].endswith(
        "skipped 80 files by extension: .000 1, .001 1, .002 1, .003 1, .004 1, others 75"
    )
    # The combiner's merge is exact in any order (what a runner's bundles may do).
    parts = [[(("extension", f".{i:03d}"), 1)] for i in range(80)]
    for seed in range(5):
        random.Random(seed).shuffle(parts)
        merged: dict = {}
        for part in parts:
            merged = add_counts(merged, add_counts({}, part).items())
        assert merged == {("extension", k): 1 for k in named} | {("extension", OTHER): 30}
