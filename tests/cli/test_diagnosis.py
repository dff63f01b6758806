"""Errors that name the cause: the all-images-fail mistakes caught up front (exit 2), the exit-3
line's top reasons and fix, and gs:// without credentials."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from beam_pipeline import main
from beam_pipeline.cli import checks
from beam_pipeline.cli.options import UserError
from transforms.failures import diagnosis_of_kinds, likely_fix, reason_kind, top_kinds
from transforms.labels.rows import TableSpec
from transforms.listing.local import walk_local

SCRIPT = Path(sys.executable).parent / "img2tfrecord"


def _png(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (200, 10, 10)).save(path)


def _run(capsys, *argv: str) -> tuple[int, list[str]]:
    status = main.main([*argv, "--quiet"])
    return status, capsys.readouterr().err.strip().splitlines()


def test_a_flat_folder_without_labels_is_one_line_with_the_fix(tmp_path, capsys):
    for i in range(3):
        _png(tmp_path / "in" / f"img{i}.png")
    status, err = _run(capsys, "--input", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"))
    assert status == 2
    (line,) = err
    assert "none of its 3 images is inside a class folder" in line
    assert "--labels" in line and "sub-folder" in line
    assert not (tmp_path / "out").exists()  # caught before anything was written


def test_split_folders_need_two_levels(tmp_path, capsys):
    _png(tmp_path / "in" / "train" / "a.png")  # a class folder, but no split folder above it
    argv = ("--input", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"), "--splits", "folders")
    status, err = _run(capsys, *argv)
    assert status == 2
    (line,) = err  # the cause (no split level) and its fixes; not the flat folder's advice
    assert "--splits folders takes each split from the first folder level" in line
    assert "in a <split>/<class>/ folder" in line and "put the class folders inside split folders" in line
    assert "--splits train=0.8,validation=0.2" in line and "own sub-folder" not in line


def test_an_output_dir_that_is_a_file_says_so(tmp_path, capsys):
    _png(tmp_path / "in" / "cat" / "a.png")
    (tmp_path / "taken").write_text("a file, not a folder")
    for output_dir in (tmp_path / "taken", tmp_path / "taken" / "sub"):
        status, err = _run(capsys, "--input", str(tmp_path / "in"), "--output_dir", str(output_dir))
        assert status == 2
        (line,) = err
        assert line == (
            f"img2tfrecord: error: --output_dir {output_dir}: {tmp_path / 'taken'} is a file, not a "
            "folder; pass the path of a folder (it is created if missing)"
        )


def test_a_table_whose_keys_match_no_image_names_the_image_key_that_would(tmp_path, capsys):
    for name in ("cat/a1.png", "dog/b2.png"):
        _png(tmp_path / "in" / name)
    table = tmp_path / "labels.csv"
    table.write_text("id,label\na1.png,cat\nb2.png,dog\n")
    argv = ("--input", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"), "--labels", str(table))
    status, err = _run(capsys, *argv)
    assert status == 2
    (line,) = err
    assert "none of its 2 keys matches an image" in line and line.endswith("pass --image_key name")


def test_a_table_with_other_keys_says_which_flags_to_check(tmp_path):
    _png(tmp_path / "in" / "x" / "a1.png")
    table = tmp_path / "labels.csv"
    table.write_text("name,label\nzz,cat\n")
    spec = TableSpec(path=str(table), format="csv", key_column="name", label_column="label")
    with pytest.raises(UserError, match=r"check --key_column \('name'\) and --image_key"):
        checks.check_keys_match(str(tmp_path / "in"), spec, "stem")


def test_one_matching_key_is_enough_and_large_tables_are_left_to_the_pipeline(tmp_path, monkeypatch):
    for name in ("x/a1.png", "x/a2.png", "x/a3.png"):
        _png(tmp_path / "in" / name)
    table = tmp_path / "labels.csv"
    table.write_text("id,label\nq,cat\nr,cat\na3,cat\n")
    spec = TableSpec(path=str(table), format="csv")
    checks.check_keys_match(str(tmp_path / "in"), spec, "stem")  # a3 matches
    table.write_text("id,label\nq,cat\nr,cat\ns,cat\n")
    with pytest.raises(UserError):
        checks.check_keys_match(str(tmp_path / "in"), spec, "stem")
    monkeypatch.setattr(checks, "MAX_KEY_ROWS", 2)
    checks.check_keys_match(str(tmp_path / "in"), spec, "stem")  # too big to tell: no error


def test_the_flat_folder_check_walks_the_tree_as_the_listing_does(tmp_path):
    # A hidden folder is no class folder (the listing leaves it out); a link to a folder is one.
    hidden, linked = tmp_path / "hidden", tmp_path / "linked"
    _png(hidden / "a.png")
    _png(hidden / ".cache" / "b.png")
    _png(linked / "a.png")
    _png(tmp_path / "elsewhere" / "c.png")
    (linked / "cls").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert [f.relpath for f in walk_local(str(hidden))] == ["a.png"]
    assert [f.relpath for f in walk_local(str(linked))] == ["a.png", "cls/c.png"]
    with pytest.raises(UserError, match="none of its 1 images is inside a class folder"):
        checks.check_class_folders(str(hidden), split_from_folders=False)
    checks.check_class_folders(str(linked), split_from_folders=False)


def test_exit_3_names_the_top_reasons_and_the_fix(tmp_path, capsys):
    # One key matches, so the up-front check passes; the other three images fail in the join.
    for name in ("c/a1.png", "c/a2.png", "c/a3.png", "c/a4.png"):
        _png(tmp_path / "in" / name)
    (tmp_path / "in" / "c" / "broken.png").write_bytes(b"")
    table = tmp_path / "labels.csv"
    table.write_text("id,label\na1,cat\nbroken,cat\n")
    argv = ("--input", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"), "--labels", str(table))
    status, err = _run(capsys, *argv)
    assert status == 3
    line = err[-1]
    assert line.startswith("img2tfrecord: error: 4 of 5 images failed")
    assert "top reasons: 3 × label missing: no row for key … in the labels table; 1 × empty file" in line
    assert "likely fix: the table's keys must be the images' keys" in line


def test_exit_3_for_images_outside_class_folders(tmp_path, capsys):
    _png(tmp_path / "in" / "cls" / "ok.png")
    for i in range(3):
        _png(tmp_path / "in" / f"flat{i}.png")
    status, err = _run(capsys, "--input", str(tmp_path / "in"), "--output_dir", str(tmp_path / "out"))
    assert status == 3
    assert "top reasons: 3 × not inside a class folder; likely fix: put each class" in err[-1]


def test_reason_kinds_group_failures_without_their_particulars():
    reasons = [f"label missing: no row for key 'k{i}' in the labels table" for i in range(5)]
    reasons += ["duplicate of a/b.jpg", "duplicate of c/d.jpg", "too large: 90000x90000 exceeds 5 pixels"]
    assert top_kinds(collections.Counter(map(reason_kind, reasons)), 2) == [
        ("label missing: no row for key … in the labels table", 5),
        ("duplicate", 2),
    ]
    assert (
        reason_kind("does not decode as jpeg: truncated (no end-of-image marker)")
        == "does not decode as jpeg"
    )
    assert likely_fix("too large") == "raise --max_pixels if these images are trusted"
    assert likely_fix("does not decode as png").startswith("remove or repair")
    assert diagnosis_of_kinds({}) == ""


def test_gs_without_credentials_is_one_line_within_seconds(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR", "CLOUDSDK"))
    }
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), GCE_METADATA_HOST="127.0.0.1:9")
    started = time.monotonic()
    result = subprocess.run(
        [str(SCRIPT), "--input", "gs://no-such-bucket/images", "--output_dir", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("img2tfrecord: error: gs://no-such-bucket/images: no Google Cloud credentials")
    assert "GOOGLE_APPLICATION_CREDENTIALS" in line
    assert elapsed < 20, elapsed


def test_verify_on_gs_without_credentials_is_one_line(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "STORAGE_EMULATOR", "CLOUDSDK"))
    }
    env.update(HOME=str(tmp_path), CLOUDSDK_CONFIG=str(tmp_path / "gcloud"), GCE_METADATA_HOST="127.0.0.1:9")
    result = subprocess.run(
        [str(SCRIPT), "verify", "gs://no-such-bucket/out"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "gs://no-such-bucket/out: no Google Cloud credentials" in line


def test_a_flat_bucket_prefix_is_caught_up_front(gcs_bucket, tmp_path, capsys):
    import io

    for i in range(3):
        data = io.BytesIO()
        Image.new("RGB", (4, 4)).save(data, format="PNG")
        gcs_bucket.blob(f"flat-prefix/img{i}.png").upload_from_string(data.getvalue())
    gcs_bucket.blob("flat-prefix/notes.txt").upload_from_string(b"not an image")
    root = f"gs://{gcs_bucket.name}/flat-prefix"
    status, err = _run(capsys, "--input", root, "--output_dir", str(tmp_path / "out"))
    assert status == 2
    assert f"--input {root}: none of its 3 images is inside a class folder" in err[-1]


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("csv", '\ufeffid,label\n" a1 ",cat\n"b\n2",dog\nc3\n./d4,x\nse\u0301oul,y\n\n"q,1",z\n'),
        ("tsv", "id\tlabel\na1\tcat\n b2 \tdog\n"),
        ("jsonl", '{"id": "a1", "label": "cat"}\n{"id": 7, "label": "x"}\nnot json\n[1]\n{"id": {"x": 1}}\n'),
    ],
)
def test_the_key_reader_sees_the_keys_the_pipeline_joins_on(tmp_path, fmt, text):
    from transforms.labels.table import iter_table

    path = tmp_path / f"t.{fmt}"
    path.write_bytes(text.encode("utf-8"))
    spec = TableSpec(path=str(path), format=fmt)
    with open(path, "rb") as f:
        want = {r.key for r in iter_table(f, spec, str(path)) if r.key}
    assert checks._table_keys(spec) == want
